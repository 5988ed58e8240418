"""AccEPT's adaptive latency predictor (papers/004 Sec. 3.2): a sub-model's forward+backward time on a
device, from the sub-model's layer-presence vector ``s`` and the device's vector ``h`` (the measured
times of ten representative sub-models).

* :mod:`.submodels`: the contiguous sub-models, their encodings, FLOPs and the representative ten (pure);
* :mod:`.measure`: timing sub-models and measuring ``h`` on this device (bounded);
* :mod:`.net`: the dual-stream regression model (the paper's) and the feature variant (ours);
* :mod:`.baselines`: FLOPs-linear, per-layer lookup table, FTPipeHD's capacity ratio;
* :mod:`.store`: the data set and trained weights on disk (provenance, ``weights_only`` loading);
* :mod:`.collect`: measuring the pre-training data under many resource configurations.
"""
