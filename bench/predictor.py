"""AccEPT's latency predictor (papers/004 Sec. 3.2, 4.2): prediction accuracy and whole-run heterogeneity.

    python bench/predictor.py [--only accuracy|runs|drift] [--epochs 5] [--repeat 1] [--json FILE]

1. **Prediction accuracy** on resource configurations held out of pre-training, four times: measured
   on a training machine (``edgeagent/predictor/data/mobilenetv2-digits-heldout.json``, by ``edgeagent
   predictor collect --set heldout``), on a machine unseen in training
   (``mobilenetv2-digits-heldout-unseen.json``, the same command with ``--rounds 8``), on a third VM
   of the training machine's kind (``mobilenetv2-digits-heldout-third.json``, ``--rounds 8``) and on CPUs
   of two other kinds emulated by their instruction set (``mobilenetv2-digits-heldout-isa.json``, ``--set
   heldout-isa``: AVX2 and SSE kernels instead of this machine's AVX-512, under a quota and batch size
   those kinds never had in training), and once more on a fourth VM whose timings hardly repeat
   (``mobilenetv2-digits-heldout-noisy.json``, an Intel Xeon, ``--rounds 8``: what noise does to every
   method): the share of MobileNetV2's 231 contiguous sub-models
   predicted within ±5 % and ±10 %, for the shipped predictor (our ``features`` variant) before and after
   2, 4 and 8 adaptive samples (``predictor+k``: the paper's update on the representatives;
   ``corrected+k``: ours, the per-layer correction from a tiling of the model into k ranges by layer
   kind, measured on the configuration; ``blended+k``: ours, the default until 2026-11-28, that correction
   and the tiles added up, weighed by the representatives; ``linear+k``: ours, the default, the tiles and
   the representatives in one linear fit, a speed per tile and an overhead per sub-model), the
   paper's dual-stream variant trained here on the same data,
   and the three baselines, every method on the same sub-models: the 189 of 231 that no method measured
   (``evaluate.scored``: not a single layer, a representative, a tile or the capacity stage; until
   2026-11-28, evening, each of ours left out its own inputs only and the baselines none, the look-up
   table scored on its 21 measured layers too) (FLOPs-linear through the device's ten representative
   points, the per-layer look-up table measured on that configuration, FTPipeHD's capacity ratio from
   the middle stage of the equal 3-way split). Paper (Fig. 7-8): about 88 % within ±5 % and over 95 %
   within ±10 %; the goal is >= 95 % within ±10 % after at most 8 samples and better than every baseline.
   Set-up differences: the paper trained on ~5,000 samples from three server CPUs with taskset core
   limits and tested on an unseen fourth CPU (1-4 cores); ours (12,012 samples, since 2026-11-28) come from
   four 2-core VMs (18 configurations on an AMD EPYC, 6 on an Intel Xeon, 8 on the EPYC with its kernels
   held to AVX2 or SSE, 10 on a second EPYC, 10 on an Intel Cascade Lake) under thread counts, CFS quotas,
   taskset, batch sizes and emulated slowdowns; the paper's variant is trained here on the same. A time is the
   fastest of 4 windows (8 on the unseen machine and the third VM) interleaved over the collection, a
   window the mean of back-to-back runs over at least 2 runs and 0.25 s (the paper: the mean of 100
   runs), with OpenMP's idle threads sleeping (OMP_WAIT_POLICY=PASSIVE). The script also prints how well
   each configuration's windows agree with each other (split-half), how many of blended+8's misses lie
   inside one tile, and a summary row per set (blended+8, the best baseline, the split-half, the goal).
   Then **as a device measures**: blended+8's and the look-up table's inputs from only k = 1, 2, 4 windows
   each (a worker measures ``--characterise-rounds``, 2), tested on the fastest of the record's other half
   of windows (fewer windows than the rows above: a noisier truth, so lower figures throughout). A fifth
   VM's set (``mobilenetv2-digits-heldout-noisy-epyc.json``, an AMD EPYC on a noisy day) and a seventh's
   (``mobilenetv2-digits-heldout-cascade.json``, an Intel Xeon of a model no other set was measured on,
   Cascade Lake: quiet at full speed, noisy under its CPU quotas) and a ninth's
   (``mobilenetv2-digits-heldout-zen3.json``, an AMD EPYC of family 25 model 1, Zen 3 without AVX-512:
   the first real CPU kind outside training whose windows mostly repeat, split-half 64-97 %) and an
   eleventh's (``mobilenetv2-digits-heldout-zen4.json``, an AMD EPYC of family 25 model 17, the training
   machine's kind, quiet: split-half 71-99 %; blended+8 95.9 %, look-up table 95.9 %, the goal met by
   under 0.1 point over the table) close the list.

   Figures (2026-11-26, 32 training configurations), blended+8 within ±10 %: 96.5 % on the training
   machine, 94.0 % on the unseen machine, 91.9 % on the third VM, 92.5 % on the emulated CPUs; ±5 %:
   78.5 %, 73.5 %, 70.5 %, 64.1 %. Corrected+8 within ±10 %: 95.7 % on the training
   machine, 93.2 % on the unseen machine, 90.6 % on the third VM (whose windows agree with each other
   for only 74.6 % of sub-models), 90.6 % on the emulated CPUs (split-half 66.2 %); look-up table 95.2 %,
   91.5 %, 90.0 %, 94.4 %. Before the correction: ours 93.7 %, 87.4 %, 84.7 %, 79.0 %; the paper's
   update +8 93.0 %, 87.7 %, 83.9 %, 78.3 %; the paper's variant +8 89.0 %, 85.4 %, 81.8 %, 75.8 %;
   capacity 60.6 %, 64.4 %, 52.2 %, 44.4 %. The goal (>= 95 % and better than every baseline) is met on
   the training machine; on the unseen machine and the third VM ours (blended+8) is better than every
   baseline but under 95 %; on the emulated CPUs the look-up table (21 measured layers) is better
   (docs/design.md). On the noisy fourth VM (split-half 41.3 %) blended+8 47.8 %, look-up table 57.0 %;
   on the fifth (2026-11-27, split-half 52.3 %) 65.3 % and 76.4 %; on the seventh (2026-11-27, Cascade Lake,
   split-half 60.7 % under its quotas) 76.2 % and 86.6 %; on the ninth (2026-11-28, Zen 3, split-half
   81.8 %) 89.3 % and 93.0 % (one thread 92 / 99 %, as the table; two threads 80 / 85 %). As a device
   measures, blended+8 / look-up table within ±10 %, k = 1 / 2 / 4: unseen machine 68.8 / 86.4 / 89.3 %
   and 80.9 / 90.0 / 90.1 %; third VM 40.9 / 50.9 / 66.2 % and 42.8 / 56.7 / 64.7 %; training machine
   63.7 / 76.1 % and 57.8 / 75.4 %; ninth VM 34.7 / 60.3 / 79.2 % and 23.2 / 51.2 / 83.1 %.

   Figures (2026-11-28, pre-trained on 52 configurations of three machines, two CPU kinds; the tenth VM,
   a Cascade Lake), blended+8 within ±10 %: 96.0 / 93.7 / 91.7 / 93.9 % (training machine / unseen machine /
   third VM / emulated CPUs), ±5 % 76.9 / 70.9 / 68.3 / 65.3 %; ninth VM (Zen 3) 90.8 % (one thread 92 /
   99 %, two threads 85 / 87 % against the table's 93 / 88 %), look-up table 93.0 %; seventh (the Cascade
   Lake kind is now in training, its held-out configurations are not) 78.3 %. Before the correction
   93.6 / 88.0 / 86.1 / 78.8 / 77.5 % (the five sets), the paper's variant +8 85.3 / 78.3 / 80.9 / 77.6 /
   67.7 %. As a device measures (k = 1 / 2 / 4): unseen machine 73.2 / 88.0 / 90.5 %, ninth VM 39.4 /
   62.6 / 80.2 %. The goal stays met on the training machine's set only (docs/design.md, "A second CPU
   kind in pre-training").
   Last, **a CPU kind outside pre-training**, the paper's own test: both predictors trained here on the
   Cascade Lake and Zen 3 files alone (``mobilenetv2-digits-cascade.json``, ``mobilenetv2-digits-zen3.json``:
   20 configurations, 4,620 samples, about the paper's 5,000), tested on the quiet Zen 4 set. Figures
   (2026-11-28, a Zen 3 VM): blended+8 92.1 % within ±10 %, the paper's update +8 74.9 %, the paper's
   variant +8 75.4 %, capacity 62.9 %, FLOPs-linear 45.5 %, look-up table 95.9 %; the goal is not met on a
   kind outside pre-training (docs/design.md, "Zen 3 in pre-training, tried").
   Figures (2026-11-28, afternoon, an Intel Xeon VM of family 6 model 207, the shipped weights), linear+8
   (the new default) within ±10 %: training machine 97.3 %, unseen machine 93.3 %, third VM 92.1 %,
   emulated CPUs 94.4 %, noisy Xeon 51.6 %, noisy EPYC 77.3 %, Cascade Lake 92.7 %, Zen 3 93.0 %, Zen 4
   96.9 % (blended+8 96.0 / 93.7 / 91.7 / 93.9 / 47.9 / 68.1 / 78.3 / 90.8 / 95.9 %, look-up table 95.2 /
   91.5 / 90.0 / 94.4 / 57.0 / 76.4 / 86.6 / 93.0 / 95.9 %). The kind outside pre-training: linear+8
   95.4 % (±5 %: 80.0 %), blended+8 91.5 %, the paper's update +8 74.7 %, its variant +8 73.9 %, look-up
   table 95.9 % (±5 %: 75.9 %); as a device measures (k = 1 / 2 / 4) 45.4 / 75.6 / 92.7 % against the
   table's 39.6 / 71.3 / 82.7 %. The goal: met on the training machine's and the Zen 4 sets; on the kind
   outside pre-training >= 95 % but 0.5 point under the table (docs/design.md, "The tiles and h in one
   linear fit").
   Figures (2026-11-28, evening, the same VM kind and weights), every method on the same 189 sub-models
   (the earlier figures: each scored on its own test set), linear+8 / blended+8 / look-up table within
   ±10 %: training machine 98.4 / 97.5 / 94.7 %, unseen machine 95.0 (94.97) / 95.1 / 90.7 %, third VM
   92.9 / 92.5 / 89.2 %, emulated CPUs 95.5 / 94.7 / 94.2 %, noisy Xeon 51.3 / 48.7 / 53.6 %, noisy EPYC
   79.0 / 68.8 / 73.8 %, Cascade Lake 93.4 / 79.0 / 85.1 %, Zen 3 95.1 / 92.7 / 92.1 %, Zen 4 97.9 / 96.2
   / 95.4 %. The kind outside pre-training: linear+8 97.2 % (±5 %: 83.3 %), blended+8 93.4 %, the
   paper's update +8 78.0 %, its variant +8 77.6 %, capacity 64.9 %, FLOPs-linear 49.7 %, look-up table
   95.4 % (±5 %: 73.1 %): the goal met there. On the single layers no method is scored on, linear+8
   would miss ±10 % on 18 of 72 there (the table measures them); with them, ours 95.3 % against the
   table's 95.8 %. The goal is met on four of the nine sets and on the kind outside pre-training; not on
   the unseen machine (by 0.03 point, 4.3 above the table), the third VM (split-half 74.6 %), Cascade
   Lake (split-half 60.7 %, 8.3 above the table) and the two noisy sets, where the table leads on one
   (split-half 41.3 %) (docs/design.md, "Every method on the same sub-models"). By sub-model length
   (``evaluate.by_length``), linear+8 / look-up table on the kind outside pre-training: 1 layer 75.0 /
   100 % (the table's inputs), 2-3 layers 93.9 / 95.5 %, 4-7 98.2 / 94.7 %, 8 or more 97.7 / 95.7 %.
   Last in the list, a quiet set from a CPU kind no training set came from, at full speed (``--set
   heldout-full``, ``mobilenetv2-digits-heldout-emerald.json``, an Intel Xeon of family 6 model 207,
   split-half 78.6 %): linear+8 91.4 %, look-up table 89.3 %, blended+8 88.8 %, the paper's update +8
   77.9 %, capacity 61.1 %; on its three configurations whose windows repeat 97.0 against the table's
   96.7 % (docs/design.md, "A quiet test on a new CPU kind at full speed").
2. **Whole-run heterogeneity** (MobileNetV2, digits, batch 32, slowdowns 1,1,10, ``--epochs`` epochs):
   samples/s of the uniform split, FTPipeHD's dynamic split (``--estimator capacity``), AccEPT's
   (``--estimator predictor``, the DP's ties broken by ``--tie-break slack``; also with FTPipeHD's
   ``latest`` rule, and with the paper's drift rule ``--drift-rule paper``) and the oracle (the DP fed
   the true slowdowns from batch 0), in one run of this script. Goal: predictor >= 0.95x oracle and >= 4x
   uniform. ``AccEPT, no tiles`` is the predictor without the tile correction (``--correction none``).
   Figures (2026-11-26, 2-core VMs, three invocations): predictor 0.95x, 1.03x and 1.00x
   oracle, 5.60x, 4.72x and 4.99x uniform; FTPipeHD 0.74x, 0.78x and 0.75x; the paper's drift rule
   0.74x, 0.66x and 0.72x (h measured 4 times against 2). After the retraining on 32 configurations and
   the tiles by layer kind (one invocation): predictor 1.06x oracle and 4.95x uniform, its first split
   the oracle's; without the tiles 0.98x; FTPipeHD 0.78x. With the blend (one invocation): predictor
   0.99x oracle and 4.59x uniform; without the tiles 0.97x; FTPipeHD 0.78x. On a noisy 2-core Intel Xeon
   VM (2026-11-27, three invocations): 0.67x oracle and 2.90x uniform before the drift's payback rule (a
   drift at batch 210 of 225 re-measured h, stopping a stage for 9.6 s of a 30 s run), then 1.06x / 4.08x
   and 0.92x / 5.03x with it (first splits [0, 12, 20, 21] and [0, 9, 18, 21], the oracle's [0, 11, 18,
   21]: h measured on a noisy machine); FTPipeHD 0.86x, 0.93x, 0.72x.
   On a 2-core Intel Cascade Lake VM (2026-11-27, two invocations): 0.94x / 6.01x and 1.24x / 7.52x; the
   oracle's split [0, 11, 18, 21] ran at 286-339 samples/s over five runs, [0, 11, 20, 21] at 350-387.
   ``--repeat N`` runs the cases in N rounds and prints each case's median (one run moves a ratio by up
   to 30 % on these VMs) and every round's ratios; ``AccEPT, rescale gaps`` is ``--drift-rule rescale``.
   On an AMD EPYC of family 25 model 17 (2026-11-28, ``--repeat 2``): predictor 0.96x oracle and 4.69x
   uniform (rounds 0.98x / 5.22x and 0.94x / 4.19x), FTPipeHD 0.76x, rescale gaps 0.88x, the paper's
   drift rule 0.54x; in an earlier invocation of the same day the default's row read 1.02x / 4.96x.
   With the linear fit as the default (2026-11-28, afternoon, an Intel Xeon of family 6 model 207, one
   invocation): predictor 1.01x oracle and 4.95x uniform, FTPipeHD 0.76x, without the tiles 1.02x.
   On an AMD EPYC of family 25 model 17 (2026-11-28, evening, the linear fit): one invocation 0.89x
   oracle and 4.33x uniform, with the same split as ``DP ties latest``, which read 1.10x (the noise of one
   run); ``--repeat 3`` 1.03x oracle and 5.14x uniform (rounds 1.02x, 1.03x, 0.96x), FTPipeHD 0.78x, the
   paper's drift rule 0.60x, without the tiles 1.03x. The title says when a figure is one round.
3. **Drift**: three equal devices, worker-1 becomes 5x slower at batch 60; the predictor's dynamic
   prediction sees the drift, asks for a new h and re-splits.
4. **Slower than its h from the start** (``--only slower``): worker-2 measures its h at full speed and
   becomes 10x slower at batch 1, before any plan check (a device loaded or throttled right after it
   joined), ``--slower-epochs`` epochs: samples/s of the predictor under each drift rule, FTPipeHD's
   capacity split and the oracle (the DP fed slowdowns 1,1,10 before batch 0), side by side.
   Figures (2026-11-28, AMD EPYC family 25 model 17, ``--repeat 2``): the default rule 454.5 samples/s,
   1.01x FTPipeHD and 0.72x the oracle (one re-plan at batch 10, a gross gap); before the gross-gap rule
   132.3, 0.27x FTPipeHD (one run); ``rescale`` 406.7; the paper's rule 110.1. The same morning's part 2
   (``--only runs --repeat 2``): predictor 1.00x oracle, 5.35x uniform.
5. **Deeper** (``--only deep``): ``--deep-devices`` devices (default 8: the central node and seven
   workers), the last 10x slower, ``--deep-epochs`` epochs: uniform, FTPipeHD, the predictor and the
   oracle. Every process shares this machine's cores, so a stage runs several times slower in the
   pipeline than alone, and the workers measure their h at the same moment, each on a share of the cores.
   Figures (2026-11-28, AMD EPYC family 25 model 17, two invocations of ``--only deep --repeat 2``):
   predictor 0.87x and 0.91x the oracle, 1.10x and 1.10x FTPipeHD, 1.44x and 1.39x uniform (the oracle
   itself 1.27x / 1.21x FTPipeHD: on 2 cores the eight processes' contention weighs more than the split).
   The workers' h, measured together on 2 cores, came out 3-4x their alone value (worker-7's 10x only
   2.7x theirs), so the first split gave the central node 10-12 of 21 layers; the default drift rule
   rescaled them as gross gaps at batch 10-13 and re-planned.
6. **Fig. 8** (``--only fig8 [--fig8-set heldout-unseen]``): 2 to 14 adaptive samples (the paper's x axis;
   part 1 stops at 8) on one held-out set, ``predictor.evaluate.sample_sweep``: the paper's update on the
   10 representatives and then random sub-models past them (the paper fills D_hat so), against ours
   (linear+k: a tiling into k ranges with h in one linear fit), both scored on the sub-models no k's
   inputs hold (the paper: every sub-model outside D_hat; a cross-validation over its devices).
   Figures (2026-11-29, the machine unseen in training, 4 configurations, 317 s on a loaded VM), within
   ±5 / ±10 % at k = 2, 4, 6, 8, 10, 12, 14: the paper's update 66.5 / 91.7, 66.2 / 91.7, 68.4 / 92.1,
   64.1 / 92.0, 68.3 / 92.1, 67.5 / 92.4, 64.3 / 91.1 %; ours 73.8 / 91.5, 80.6 / 93.4, 77.7 / 95.7, 78.5 /
   95.7, 78.5 / 96.0, 78.4 / 95.7, 81.3 / 98.1 %. Paper: rising to ~90 / ~96 % by 8 samples, flat after.
   Ours climbs to the paper's ±10 % figure by 6-8 samples and passes it at 14; the paper's update stays
   flat (its first samples are the representatives h already holds) and far below its ±5 % figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgeagent.cli.demo import run_demo
from edgeagent.config import CentralConfig, TrainConfig
from edgeagent.models import ModelSpec
from edgeagent.ops.logs import setup_logging
from edgeagent.predictor.collect import load_records
from edgeagent.predictor.evaluate import (
    LENGTHS,
    SWEEP_SAMPLES,
    by_length,
    evaluate,
    fewer_windows,
    repeatability,
    sample_sweep,
)
from edgeagent.predictor.net import LatencyPredictor, Variant
from edgeagent.predictor.store import load, samples_of, shipped_path
from edgeagent.roles.central import RunReport

DATA = Path(__file__).resolve().parents[1] / "edgeagent" / "predictor" / "data"
SPEC = ModelSpec("mobilenetv2", (1, 8, 8), 10)
PAPER = {"±5%": 0.88, "±10%": 0.95}
BASELINES = ("flops-linear", "lookup-table", "capacity")  # the issue's three
OURS = "linear+8"  # the default correction's row (blended+8 until 2026-11-28)
WINDOWS = (1, 2, 4)  # windows per input in "as a device measures"


HELD_OUT = {
    "accuracy": ("held out of training, measured on a training machine", "mobilenetv2-digits-heldout.json"),
    "accuracy_unseen_machine": ("held out of training, measured on a machine unseen in training",
                                "mobilenetv2-digits-heldout-unseen.json"),
    "accuracy_third_machine": ("held out of training, measured on a third VM (times like the training "
                               "machine's, noisier)", "mobilenetv2-digits-heldout-third.json"),
    "accuracy_emulated_cpus": ("held out of training, on CPUs of two other kinds emulated by their "
                               "instruction set (AVX2, SSE; a quota and batch size those kinds never had "
                               "in training)", "mobilenetv2-digits-heldout-isa.json"),
    "accuracy_noisy_machine": ("held out of training, measured on a fourth VM (an Intel Xeon) whose timings "
                               "hardly repeat: how the measurement's own noise bounds every method",
                               "mobilenetv2-digits-heldout-noisy.json"),
    "accuracy_noisy_epyc": ("held out of training, measured on a fifth VM (an AMD EPYC on a noisy day): "
                            "noise again", "mobilenetv2-digits-heldout-noisy-epyc.json"),
    "accuracy_cascade": ("held out of training, measured on a seventh VM (an Intel Xeon of family 6 model "
                         "85, Cascade Lake, the kind of one training file since 2026-11-28): quiet at full "
                         "speed, noisy under its CPU quotas",
                         "mobilenetv2-digits-heldout-cascade.json"),
    "accuracy_zen3": ("held out of training, measured on a ninth VM (an AMD EPYC of family 25 model 1, "
                      "Zen 3: AVX2, no AVX-512; a CPU kind no training set came from)",
                      "mobilenetv2-digits-heldout-zen3.json"),
    "accuracy_zen4": ("held out of training, measured on an eleventh VM (an AMD EPYC of family 25 model 17, "
                      "Zen 4: the fifth VM's kind, most likely the training machine's; quiet that day)",
                      "mobilenetv2-digits-heldout-zen4.json"),
    "accuracy_emerald": ("held out of training, at full speed (--set heldout-full: no quota; batch sizes 24 "
                         "and 48, two threads on one core), measured on an Intel Xeon VM of family 6 model "
                         "207 (Emerald Rapids by its model number: AVX-512 and AMX; a CPU kind no training "
                         "set came from, whose quotas were too noisy to test on three times)",
                         "mobilenetv2-digits-heldout-emerald.json"),
}  # fmt: skip

# The paper's test: a CPU kind no training data came from. Both EPYC training files are left out, since
# the second one's kind was not recorded; what is left is the two kinds collected with their CPU id.
UNSEEN_KIND = (
    "mobilenetv2-digits-heldout-zen4.json",  # Zen 4, quiet (split-half 71-99 %)
    ("mobilenetv2-digits-cascade.json", "mobilenetv2-digits-zen3.json"),  # Cascade Lake, Zen 3: 4,620 samples
)


def accuracy(results: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    weights = shipped_path(SPEC)
    if not weights.exists():
        raise SystemExit("no shipped predictor: run `edgeagent predictor train --data ...` first")
    ours, header = load(weights)
    files = header["provenance"]["data"]  # what ours trained on; the first holds FTPipeHD's reference
    training, (paper,), fit = _pretrained(files, "paper")
    print(
        f"1. Prediction accuracy: MobileNetV2's {len(training[0]['seconds'])} sub-models; pre-trained on "
        f"{len(samples_of(training))} samples from {len(training)} configurations in {', '.join(files)} "
        f"(the paper's variant trained here on the same in {fit:.0f} s)"
    )
    for key, (label, name) in HELD_OUT.items():
        results[key] = _accuracy_on(label, load_records(DATA / name), ours, paper, training)
    print(f"\n   Summary, within ±10 % (goal: {OURS} >= 95 % and better than every baseline):")
    head = f"   {'held-out set':<18}{OURS:>10}{'blended+8':>10}{'best baseline':>30}"
    print(f"{head}{'split-half':>12}{'goal':>6}")
    for key, (_, name) in HELD_OUT.items():
        table = results[key]["mean"]
        ours_ten = table[OURS][1]
        best = max(BASELINES, key=lambda m: table[m][1])
        met = ours_ten >= PAPER["±10%"] and all(ours_ten > table[m][1] for m in BASELINES)
        where = _set_name(name)
        repeat = f"{table['measurement repeat'][1]:.1%}" if "measurement repeat" in table else "-"
        print(
            f"   {where:<18}{ours_ten:>10.1%}{table['blended+8'][1]:>10.1%}{best:>22}{table[best][1]:>8.1%}"
            f"{repeat:>12}{'met' if met else 'not':>6}"
        )
    print(
        "   (split-half: the measurement against itself, each half the windows; a set whose windows do "
        "not repeat is no test of a predictor)"
    )
    print(
        f"\n   As a device measures: {OURS}'s, blended+8's and the look-up table's inputs each from the "
        "fastest of k windows\n   (a worker: --characterise-rounds, default 2), tested on the times of other "
        f"windows; within ±10 % ({OURS} / blended+8 / look-up table)"
    )
    print(f"   {'held-out set':<22}" + "".join(f"{f'k={k}':>26}" for k in WINDOWS))
    for key, (_, name) in HELD_OUT.items():
        cells = ""
        for k, table in _as_a_device_measures(ours, load_records(DATA / name)).items():
            results[key][f"inputs from {k} windows"] = table
            cells += f"{_device_cell(table):>26}"
        print(f"   {_set_name(name):<22}{cells}")
    print(
        f"\n   By sub-model length (a deep pipeline's stages are short ranges): {OURS} / look-up table "
        "within ±10 %, the scored sub-models\n   and the single layers that are not ours' inputs (scored for "
        "no method: the table measured them)"
    )
    print(f"   {'held-out set':<22}" + "".join(f"{_band(band):>20}" for band in LENGTHS))
    for key, (_, name) in HELD_OUT.items():
        counts = by_length(ours, load_records(DATA / name), training)
        results[key]["by length"] = _by_band(counts)
        print(f"   {_set_name(name):<22}{_length_cells(counts)}")
    unseen_kind(results)


def _band(band: tuple[int, int]) -> str:
    low, high = band
    if low == high:
        return f"{low} layer" + ("s" if low > 1 else "")
    return f"{low}-{high} layers" if high < 10**9 else f">= {low} layers"


def _set_name(name: str) -> str:
    """A held-out file's short name (``heldout-zen4``)."""
    return name.removeprefix("mobilenetv2-digits-").removesuffix(".json")


LengthCounts = dict[str, dict[tuple[int, int], tuple[int, int]]]  # evaluate.by_length's


def _by_band(counts: LengthCounts) -> dict[str, dict[str, tuple[int, int]]]:
    """``by_length``'s counts keyed by band name, for the JSON results."""
    return {_band(b): {m: c[b] for m, c in counts.items()} for b in LENGTHS}


def _length_cells(counts: LengthCounts) -> str:
    cells = ""
    for band in LENGTHS:
        (ours_hits, tested), (table_hits, _) = counts[OURS][band], counts["lookup-table"][band]
        cells += f"{f'{ours_hits / tested:.1%} / {table_hits / tested:.1%}':>20}" if tested else f"{'-':>20}"
    return cells


def unseen_kind(results: dict[str, Any]) -> None:
    """The paper's set-up: pre-trained on other CPU kinds (about its 5,000 samples), tested on a new one."""
    held_name, files = UNSEEN_KIND
    training, (ours, paper), fit = _pretrained(files, "features", "paper")
    print(
        f"\n   A CPU kind outside pre-training (the paper's test: three CPUs in training, a fourth tested): "
        f"both predictors trained\n   here on {len(samples_of(training))} samples of {', '.join(files)} only "
        f"(Cascade Lake, Zen 3; {fit:.0f} s),\n   tested on {held_name} (Zen 4)"
    )
    held_out = load_records(DATA / held_name)
    table = _accuracy_on("of a CPU kind outside this pre-training", held_out, ours, paper, training)
    shipped = results.get("accuracy_zen4", {}).get("mean", {}).get(OURS)
    best = max(BASELINES, key=lambda m: table["mean"][m][1])
    ten = table["mean"][OURS][1]
    print(
        f"   {OURS} {ten:.1%} within ±10 % (blended+8 {table['mean']['blended+8'][1]:.1%}), "
        f"{best} {table['mean'][best][1]:.1%}"
        + (f"; the shipped predictor (Zen 4's kind in its training) {shipped[1]:.1%}" if shipped else "")
    )
    device = _as_a_device_measures(ours, held_out)
    cells = ", ".join(f"k={k} {_device_cell(t)}" for k, t in device.items() if t)
    print(f"   as a device measures ({OURS} / blended+8 / look-up table within ±10 %): {cells}")
    table["as a device measures"] = device
    counts = by_length(ours, held_out, training)
    heads = "".join(f"{_band(band):>20}" for band in LENGTHS)
    print(f"   by sub-model length ({OURS} / look-up table within ±10 %):\n   {'':<22}{heads}\n   {'':<22}"
          f"{_length_cells(counts)}")  # fmt: skip
    table["by length"] = _by_band(counts)
    results["accuracy_unseen_kind"] = table


def _as_a_device_measures(
    predictor: LatencyPredictor, records: list[dict[str, Any]]
) -> dict[int, dict[str, tuple[float, float]]]:
    """Per k of :data:`WINDOWS`: every method's shares with its inputs from k windows (``fewer_windows``)."""
    return {k: fewer_windows(predictor, records, k).mean() for k in WINDOWS}


def _device_cell(table: dict[str, tuple[float, float]]) -> str:
    """``ours / blended+8 / look-up table`` within ±10 % ("-": no record had the windows)."""
    return " / ".join(f"{table[m][1]:.1%}" for m in (OURS, "blended+8", "lookup-table")) if table else "-"


def _pretrained(
    files: Sequence[str], *variants: Variant
) -> tuple[list[dict[str, Any]], list[LatencyPredictor], float]:
    """The records of ``files``, a predictor of each variant pre-trained on them (its default steps) and
    the seconds that took."""
    training = [r for name in files for r in load_records(DATA / name)]
    samples = samples_of(training)
    started = time.perf_counter()
    fitted = [LatencyPredictor.fit(samples, training[0]["flops"], variant=v) for v in variants]
    return training, fitted, time.perf_counter() - started


def _accuracy_on(
    label: str,
    held_out: list[dict[str, Any]],
    ours: LatencyPredictor,
    paper: LatencyPredictor,
    training: list[dict[str, Any]],
) -> dict[str, Any]:
    scores, rows = evaluate(ours, held_out, training)
    paper_scores, paper_rows = evaluate(paper, held_out, training)
    table = scores.mean()
    for method, value in paper_scores.mean().items():
        if method.startswith("predictor"):
            table["paper-variant" + method.removeprefix("predictor")] = value
    machine = {(r["cpu"], r["measured_at"][:10]) for r in held_out}
    rounds = {int(r.get("rounds", 1)) for r in held_out}
    print(
        f"\n   {len(held_out)} configurations {label} ({', '.join(f'{c}, {d}' for c, d in sorted(machine))}; "
        f"a time the fastest of {'/'.join(map(str, sorted(rounds)))} windows)"
    )
    print(f"   {'method':<22}{'±5%':>8}{'±10%':>8}   paper")
    for method, (five, ten) in table.items():
        note = ""
        if method == "predictor+8":
            note = f"   ~{PAPER['±5%']:.0%} / >{PAPER['±10%']:.0%} (Fig. 8, 8 samples: the representatives)"
        elif method == "corrected+8":
            note = "   ours, 8 samples: a tiling"
        elif method == "blended+8":
            note = "   ours (the default until 2026-11-28), the same tiling"
        elif method == OURS:
            note = "   ours (the default), the same tiling; goal >= 95 % at ±10 %"
        elif method == "predictor":
            note = f"   ~{PAPER['±5%']:.0%} / >{PAPER['±10%']:.0%} (Fig. 7)"
        print(f"   {method:<22}{five:>8.1%}{ten:>8.1%}{note}")
    print("   per configuration (±10 %):")
    ceilings = []
    for row, prow, record in zip(rows, paper_rows, held_out, strict=True):
        cells = ", ".join(f"{m} {v[1]:.0%}" for m, v in row.items() if m not in ("config", "misses"))
        repeat = repeatability(record)
        ceiling = "" if repeat is None else f"; its windows' split-half agreement {repeat[1]:.0%}"
        ceilings.append(repeat)
        print(f"     {row['config']}: {cells}; paper-variant+8 {prow['predictor+8'][1]:.0%}{ceiling}")
    for method in (OURS, "blended+8"):
        counts = [row["misses"][method] for row in rows]
        missed, inside = (sum(c[key] for c in counts) for key in ("missed", "missed inside one tile"))
        tested, tested_inside = (sum(c[key] for c in counts) for key in ("tested", "tested inside one tile"))
        ones, ones_missed = (sum(c[key] for c in counts) for key in ("single layers", "single layers missed"))
        print(
            f"   {method} missed ±10 % on {missed} of {tested} sub-models; {inside} of them lie inside one "
            f"tile (the predictor's shares of the tile decide),\n   which are {tested_inside} of the "
            f"{tested} tested; on the single layers (the look-up table's inputs, scored for no method) it "
            f"would miss {ones_missed} of {ones}"
        )
    known = [c for c in ceilings if c is not None]
    if known:
        five, ten = (sum(c[i] for c in known) / len(known) for i in (0, 1))
        print(
            f"   the measurement against itself (the even rounds' fastest window vs the odd rounds', each "
            f"half the windows the time is taken from): {five:.1%} within ±5 %, {ten:.1%} within ±10 %"
        )
        table["measurement repeat"] = (five, ten)
    return {"mean": table, "per_config": rows}


def run(partition: str, estimator: str, slowdowns: list[float], epochs: int, **extra: Any) -> RunReport:
    train = TrainConfig(model="mobilenetv2", dataset="digits", epochs=epochs, batch_size=32)
    config = CentralConfig(train=train, progress=False, partition=partition, estimator=estimator, **extra)
    return run_demo(config, workers=len(slowdowns) - 1, slowdowns=slowdowns, broker=None, show_progress=False)


def _rounds_shown(repeat: int) -> str:
    """The title's note on how many rounds a figure is: one run moves a ratio by up to 30 % on a 2-core
    machine (on 2026-11-28 the default's row read 0.89x the oracle in one run, 1.03x as the median of three
    rounds of 1.02x, 1.03x and 0.96x)."""
    if repeat == 1:
        return ", one round (a single run moves a ratio by up to 30 %: --repeat 3 prints medians)"
    return f", the median of {repeat} rounds"


def runs(results: dict[str, Any], epochs: int, repeat: int = 1) -> None:
    slowdowns = [1.0, 1.0, 10.0]
    cases: dict[str, tuple[str, str, dict[str, Any]]] = {
        "uniform": ("uniform", "capacity", {}),
        "FTPipeHD (capacity)": ("dynamic", "capacity", {}),
        "AccEPT, DP ties latest": ("dynamic", "predictor", {"tie_break": "latest"}),
        "AccEPT, paper's drift": ("dynamic", "predictor", {"drift_rule": "paper"}),
        "AccEPT, rescale gaps": ("dynamic", "predictor", {"drift_rule": "rescale"}),
        "AccEPT, no tiles": ("dynamic", "predictor", {"correction": "none"}),
        "AccEPT (predictor)": ("dynamic", "predictor", {}),
        "oracle": ("oracle", "capacity", {}),
    }
    # Rounds, not one case ``repeat`` times in a row: a slow minute of the machine then costs every case
    # one run, which the median drops, instead of every run of one case.
    rounds = [
        {name: run(p, e, slowdowns, epochs, **kw) for name, (p, e, kw) in cases.items()}
        for _ in range(repeat)
    ]
    rates = {name: statistics.median(r[name].samples_per_second for r in rounds) for name in cases}
    uni, ora = rates["uniform"], rates["oracle"]
    shown = _rounds_shown(repeat)
    print(
        f"\n2. Whole run: MobileNetV2 on digits, batch 32, {epochs} epochs, slowdowns 1,1,10 (central first)"
        f"{shown}"
    )
    print(
        f"   {'split':<22}{'samples/s':>10}{'x uniform':>10}{'x oracle':>9}{'final acc':>10}"
        "  first split -> last (the last round's)"
    )
    out = {}
    for name, rate in rates.items():
        r = rounds[-1][name]
        first = (
            r.partitions[1]["points"]
            if len(r.partitions) > 1 and r.partitions[1]["batch"] == 0
            else r.partitions[0]["points"]
        )
        print(
            f"   {name:<22}{rate:>10.1f}{rate / uni:>9.2f}x{rate / ora:>8.2f}x{r.final_accuracy:>10.1%}"
            f"  {first} -> {r.partitions[-1]['points']}"
        )
        out[name] = {
            "samples_per_second": rate,
            "per_round": [rr[name].samples_per_second for rr in rounds],
            "final_accuracy": r.final_accuracy,
            "partitions": r.partitions,
        }
    acc = rates["AccEPT (predictor)"]
    paper_drift = rates["AccEPT, paper's drift"]
    print(
        f"   predictor / oracle = {acc / ora:.2f} (goal >= 0.95); "
        f"predictor / uniform = {acc / uni:.2f} (goal >= 4); "
        f"DP ties slack / latest (FTPipeHD's rule) = {acc / rates['AccEPT, DP ties latest']:.2f}; "
        f"drift rule changed / paper = {acc / paper_drift:.2f}; "
        f"changed / rescale = {acc / rates['AccEPT, rescale gaps']:.2f}; "
        f"tile correction / none = {acc / rates['AccEPT, no tiles']:.2f}"
    )
    if repeat > 1:
        for i, rr in enumerate(rounds, 1):
            a, o, u = (rr[n].samples_per_second for n in ("AccEPT (predictor)", "oracle", "uniform"))
            print(
                f"   round {i}: predictor / oracle {a / o:.2f}, / uniform {a / u:.2f}"
                f" (oracle {o:.0f} samples/s)"
            )
    for name, r in rounds[-1].items():
        if r.characterisations:
            print(f"   {name}: h measured {len(r.characterisations)} times (at join included)")
    results["runs"] = out


def drift(results: dict[str, Any], epochs: int) -> None:
    change = 60
    r = run(
        "dynamic",
        "predictor",
        [1.0, 1.0, 1.0],
        epochs,
        slowdown_changes=[f"worker-1@{change}=5"],
        repartition_every=40,
    )
    print(f"\n3. Drift: equal devices, worker-1 5x slower from batch {change}, plan checks every 40 batches")
    for p in r.partitions:
        print(f"   batch {p['batch']:>4}: {p['points']}  ({p['reason']})")
    for c in r.characterisations:
        print(
            f"   h of {c['device']} at batch {c['batch']}: {1e3 * min(c['h']):.1f}-{1e3 * max(c['h']):.1f} ms"
        )
    moved = [p for p in r.partitions if p["batch"] > change]
    print("   split followed the slowdown" if moved else "   split did NOT follow the slowdown")
    results["drift"] = {"partitions": r.partitions, "characterisations": r.characterisations}


Case = tuple[str, str, list[float], dict[str, Any]]  # partition, estimator, slowdowns, CentralConfig fields


def side_by_side(title: str, cases: dict[str, Case], epochs: int, repeat: int) -> dict[str, Any]:
    """Run ``cases`` in ``repeat`` rounds and print each one's median samples/s against the oracle's and
    FTPipeHD's (both must be among the cases), its splits and any h measured mid-run."""
    rounds = [
        {name: run(p, e, sd, epochs, **kw) for name, (p, e, sd, kw) in cases.items()} for _ in range(repeat)
    ]
    rates = {name: statistics.median(r[name].samples_per_second for r in rounds) for name in cases}
    ora, ftp = rates["oracle"], rates["FTPipeHD (capacity)"]
    shown = _rounds_shown(repeat)
    print(f"\n{title}, {epochs} epochs{shown}")
    print(f"   {'split':<22}{'samples/s':>10}{'x oracle':>9}{'x FTPipeHD':>11}  splits (the last round's)")
    out = {}
    for name, rate in rates.items():
        r = rounds[-1][name]
        moves = " -> ".join(f"{p['points']}@{p['batch']}" for p in r.partitions)
        print(f"   {name:<22}{rate:>10.1f}{rate / ora:>8.2f}x{rate / ftp:>10.2f}x  {moves}")
        again = [c["batch"] for c in r.characterisations if c["batch"] > 0]
        if again:
            print(f"   {'':<22}h measured again at batches {again}")
        out[name] = {
            "samples_per_second": rate,
            "per_round": [rr[name].samples_per_second for rr in rounds],
            "partitions": r.partitions,
        }
    return out


def slower(results: dict[str, Any], epochs: int, repeat: int = 1) -> None:
    """Part 4: a device slower than its h from batch 1 (see the module's docstring)."""
    change = {"slowdown_changes": ["worker-2@1=10"]}
    equal = [1.0, 1.0, 1.0]
    cases: dict[str, Case] = {
        "FTPipeHD (capacity)": ("dynamic", "capacity", equal, change),
        "AccEPT, paper's drift": ("dynamic", "predictor", equal, {**change, "drift_rule": "paper"}),
        "AccEPT, rescale gaps": ("dynamic", "predictor", equal, {**change, "drift_rule": "rescale"}),
        "AccEPT (predictor)": ("dynamic", "predictor", equal, change),
        "oracle": ("oracle", "capacity", [1.0, 1.0, 10.0], {}),
    }
    title = "4. Slower than its h from the start: worker-2 measures h at full speed, 10x slower from batch 1"
    results["slower"] = side_by_side(title, cases, epochs, repeat)


def deep(results: dict[str, Any], devices: int, epochs: int, repeat: int = 1) -> None:
    """Part 5: a deeper pipeline, the last worker 10x slower (see the module's docstring)."""
    slowdowns = [1.0] * (devices - 1) + [10.0]
    cases: dict[str, Case] = {
        "uniform": ("uniform", "capacity", slowdowns, {}),
        "FTPipeHD (capacity)": ("dynamic", "capacity", slowdowns, {}),
        "AccEPT (predictor)": ("dynamic", "predictor", slowdowns, {}),
        "oracle": ("oracle", "capacity", slowdowns, {}),
    }
    title = f"5. Deeper: {devices} devices (central first), the last 10x slower"
    out = side_by_side(title, cases, epochs, repeat)
    uni = out["uniform"]["samples_per_second"]
    print(f"   predictor / uniform = {out['AccEPT (predictor)']['samples_per_second'] / uni:.2f}")
    results["deep"] = out


# Fig. 8 as read off the paper's text (Sec. 4.2.1): accuracy climbs with the samples, steady from 8 on at
# about 90 % within ±5 % and 96 % within ±10 %.
PAPER_FIG8 = "rises to ~90 % / ~96 % by 8 samples, flat to 14"


def fig8(results: dict[str, Any], held: str) -> None:
    """Fig. 8: 2 to 14 adaptive samples on one held-out set, the paper's update against ours."""
    torch.set_num_threads(1)
    ours, _ = load(shipped_path(SPEC))
    name = f"mobilenetv2-digits-{held}.json"
    records = load_records(DATA / name)
    started = time.perf_counter()
    sweep = sample_sweep(ours, records)
    print(
        f"\n6. Fig. 8: adaptive samples 2-14 on {name} ({len(records)} configurations; the shipped "
        f"predictor; {time.perf_counter() - started:.0f} s)\n   predictor+k: the paper's update on the 10 "
        "representatives, then random sub-models past them (as the paper fills D_hat); linear+k: ours,\n"
        "   a tiling into k ranges and the representatives (h) in one linear fit. Scored on the sub-models "
        "no k's inputs hold (the paper: those not in D_hat)."
    )
    print(f"   {'k':>3}{'predictor+k ±5%':>17}{'±10%':>7}{'linear+k ±5%':>15}{'±10%':>7}   paper (Fig. 8)")
    for k, table in sweep.items():
        (p5, p10), (l5, l10) = table["predictor"], table["linear"]
        note = PAPER_FIG8 if k == SWEEP_SAMPLES[0] else ""
        print(f"   {k:>3}{p5:>17.1%}{p10:>7.1%}{l5:>15.1%}{l10:>7.1%}   {note}")
    results["fig8"] = {"set": name, "sweep": {str(k): v for k, v in sweep.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=["accuracy", "runs", "drift", "slower", "deep", "fig8"])
    parser.add_argument(
        "--fig8-set", default="heldout-unseen", help="fig8: the held-out set (mobilenetv2-digits-SET.json)"
    )
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--slower-epochs", type=int, default=3, help="epochs of part 4's runs")
    parser.add_argument("--deep-devices", type=int, default=8, choices=range(4, 13), metavar="4-12")
    parser.add_argument("--deep-epochs", type=int, default=2, help="epochs of part 5's runs")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        choices=range(1, 21),
        metavar="1-20",
        help="rounds of the whole runs; medians printed",
    )
    parser.add_argument("--json")
    args = parser.parse_args()
    setup_logging("WARNING")
    results: dict[str, Any] = {}
    if args.only in (None, "accuracy"):
        accuracy(results)
    if args.only in (None, "runs"):
        runs(results, args.epochs, args.repeat)
    if args.only in (None, "drift"):
        drift(results, args.epochs)
    if args.only in (None, "slower"):
        slower(results, args.slower_epochs, args.repeat)
    if args.only in (None, "deep"):
        deep(results, args.deep_devices, args.deep_epochs, args.repeat)
    if args.only in (None, "fig8"):
        fig8(results, args.fig8_set)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
