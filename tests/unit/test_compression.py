"""Pure tests of the AccEPT codecs (paper 004, Sec. 3.3-3.4 and Table 3): no broker, no I/O."""

from __future__ import annotations

import functools
import math
import time
from typing import Any

import cbor2
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeagent.compression import (
    BitSchedule,
    Codec,
    CodecState,
    Compressed,
    CompressionError,
    Identity,
    MultiBitQuantizer,
    Role,
    StochasticQuantizer,
    auto_bits,
    from_wire,
    get_codec,
    known_codecs,
    register,
    to_wire,
    wire_id_for,
)
from edgeagent.compression.multibit import (
    assign_codes,
    fit_alpha,
    pack_bases,
    residue_init,
    sign_table,
    smoothing_beta,
    unpack_bases,
)
from edgeagent.errors import ConfigError, ProtocolError

# MobileNetV2's largest latent output at batch 128 (Table 3 measures a 4 MiB one; this is 12 MiB).
BIG = (128, 96, 16, 16)
FOUR_MIB = (128, 32, 16, 16)


def rel_mse(x: torch.Tensor, y: torch.Tensor) -> float:
    return float(((x - y) ** 2).mean() / x.var())


def normal(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@functools.cache
def big_activation() -> torch.Tensor:
    return normal(BIG, seed=1)


# --- packing ----------------------------------------------------------------------------------


def reference_pack(codes: np.ndarray, k: int) -> bytes:
    """The layout spelled out with numpy: B (n, M, k) of bits, packed along the batch axis."""
    bits = ((codes[:, :, None] >> np.arange(k)) & 1).astype(np.uint8)  # (n, M, k)
    return np.packbits(bits, axis=0).tobytes()  # pads n up to a multiple of 8 with zeros


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), m=st.integers(1, 24), k=st.sampled_from([2, 3, 4]), seed=st.integers(0, 2**31))
def test_pack_round_trip_is_exact_and_matches_np_packbits(n: int, m: int, k: int, seed: int) -> None:
    codes = np.random.default_rng(seed).integers(0, 1 << k, size=(n, m)).astype(np.uint8)
    data = pack_bases(codes, k)
    assert len(data) == math.ceil(n / 8) * m * k
    assert data == reference_pack(codes, k)
    assert np.array_equal(unpack_bases(data, n, m, k), codes)


def test_fig6_example_first_sample_is_the_most_significant_bit() -> None:
    # Fig. 6: eight samples of one element whose basis reads 0,0,1,1,0,1,1,0 -> (00110110)_2 = 54.
    column = np.array([0, 0, 1, 1, 0, 1, 1, 0], dtype=np.uint8)
    codes = (column | (1 - column) << 1).astype(np.uint8).reshape(8, 1)  # basis 1: the complement
    assert list(pack_bases(codes, 2)) == [54, 255 - 54]


# --- multi-bit quantization -------------------------------------------------------------------


@pytest.mark.parametrize("relu", [False, True], ids=["normal", "relu"])
def test_reconstruction_error_falls_as_k_rises(relu: bool) -> None:
    x = normal((64, 32, 8, 8))
    if relu:
        x = torch.relu(x)  # half zeros, a one-sided tail: the usual activation after BN + ReLU
    errors = [
        rel_mse(x, MultiBitQuantizer(k).decompress(MultiBitQuantizer(k).compress(x))) for k in (2, 3, 4)
    ]
    assert errors[0] > errors[1] > errors[2]
    assert errors[0] < (0.15 if not relu else 0.35)


def test_nearest_candidate_is_chosen() -> None:
    x = normal((4096,))
    alpha = torch.tensor([0.9, -0.4, 0.2], dtype=torch.float64)
    candidates = (sign_table(3) @ alpha).to(torch.float32)  # (8,)
    codes = assign_codes(x, alpha).to(torch.int64)
    best = (x[:, None] - candidates[None, :]).abs().min(dim=1).values
    assert torch.allclose((x - candidates[codes]).abs(), best)


def test_closed_form_alpha_is_least_squares() -> None:
    x = normal((5000,))
    codes = assign_codes(x, residue_init(x, 3))
    alpha, counts, total = fit_alpha(x, codes, 3)
    basis = sign_table(3)[codes.to(torch.int64)]  # (N, k) the explicit B
    expected = torch.linalg.lstsq(basis, x.to(torch.float64).unsqueeze(1)).solution.squeeze(1)
    assert torch.allclose(alpha, expected, atol=1e-9)
    assert counts.sum() == x.numel() and total == pytest.approx(float(x.double().sum()))


def test_exact_multibit_structure_is_recovered() -> None:
    # x = 3 b1 + 1 b2 with balanced signs: the residue method finds α = (3, 1) and the error is 0.
    signs = sign_table(2)[torch.arange(4).repeat(64)].to(torch.float32)  # (256, 2)
    x = (signs @ torch.tensor([3.0, 1.0])).reshape(32, 8)
    assert residue_init(x.reshape(-1), 2).tolist() == [3.0, 1.0]
    c = MultiBitQuantizer(2).compress(x)
    assert torch.allclose(MultiBitQuantizer(2).decompress(c), x)


def test_bias_correction_keeps_the_mean() -> None:
    x = torch.relu(normal((16, 8, 8, 8))) + 0.3
    c = MultiBitQuantizer(2).compress(x)
    # mean(B α - m_q) = mean(x) by construction of m_q (eq. 5)
    assert float(MultiBitQuantizer(2).decompress(c).double().mean()) == pytest.approx(
        float(x.double().mean()), abs=1e-5
    )
    assert c.params["bias"] != 0


def test_smoothing_damps_alpha_between_batches() -> None:
    codec = MultiBitQuantizer(2)
    state = CodecState()
    first, second = normal((32, 64), seed=1), 2.0 * normal((32, 64), seed=2)  # the scale doubles
    alpha0 = torch.tensor(codec.compress(first, state=state).params["alpha"], dtype=torch.float64)
    assert state.t == 1
    alpha1 = torch.tensor(codec.compress(second, state=state).params["alpha"], dtype=torch.float64)
    x = second.reshape(-1)
    unsmoothed, _, _ = fit_alpha(x, assign_codes(x, alpha0), 2)
    beta = smoothing_beta(1)
    assert torch.allclose(alpha1, beta * alpha0 + (1 - beta) * unsmoothed)
    assert (alpha1 - alpha0).norm() < (unsmoothed - alpha0).norm()
    assert state.alpha == alpha1.tolist() and state.t == 2


def test_beta_schedule() -> None:
    assert smoothing_beta(0) == pytest.approx(0.1)
    assert smoothing_beta(1) == pytest.approx(2 / 11)
    assert smoothing_beta(80) == pytest.approx(0.9)
    assert smoothing_beta(10_000) == 0.9


def test_new_epoch_and_new_width_reinitialise_from_residues() -> None:
    state = CodecState()
    x = normal((16, 16))
    for _ in range(3):
        MultiBitQuantizer(2).compress(x, state=state)
    assert state.t == 3
    state.start_epoch(1)
    stateless = MultiBitQuantizer(2).compress(x)
    assert MultiBitQuantizer(2).compress(x, state=state).params == stateless.params
    assert state.t == 1 and state.alpha_epoch == 1
    MultiBitQuantizer(3).compress(x, state=state)  # a wider code needs three coefficients
    assert state.t == 1 and state.alpha is not None and len(state.alpha) == 3


def test_all_zero_tensor_and_recovery_after_it() -> None:
    state = CodecState()
    zeros = torch.zeros(8, 4)
    assert torch.equal(
        MultiBitQuantizer(2).decompress(MultiBitQuantizer(2).compress(zeros, state=state)), zeros
    )
    x = normal((8, 4))
    y = MultiBitQuantizer(2).decompress(MultiBitQuantizer(2).compress(x, state=state))
    assert rel_mse(x, y) < 0.3  # α = 0 collapsed every candidate; the codec starts again from residues


# --- stochastic quantization ------------------------------------------------------------------


@pytest.mark.parametrize("bits", [8, 4])
def test_stochastic_rounding_is_unbiased(bits: int) -> None:
    """Mean of R quantizations of a fixed g is within 3 s / sqrt(R) of g, element by element.

    Each draw q s lies in [floor(g/s) s, (floor(g/s) + 1) s], an interval of length s, so by
    Hoeffding P(|mean - E| >= eps) <= 2 exp(-2 R eps^2 / s^2) = 2 exp(-18) ~ 3e-8 for
    eps = 3 s / sqrt(R); over 256 elements the union bound is below 1e-5, and the seed is fixed.
    A biased rounding (nearest rounding is off by up to s / 2) fails the bound: 3 / sqrt(R) << 1/2.
    """
    g = normal((256,), seed=3) * 1e-3
    g[0] = 4e-3  # the peak fixes s; every row below has the same peak, hence the same s
    rows = 4096
    codec = StochasticQuantizer(bits)
    c = codec.compress(g.expand(rows, -1).contiguous(), generator=torch.Generator().manual_seed(7))
    s = c.params["scale"]
    mean = codec.decompress(c).double().mean(dim=0)  # (256,)
    assert float((mean - g.double()).abs().max()) < 3 * s / math.sqrt(rows)
    # Small gradients survive on average: nearest rounding would send every |g| < s/2 as 0.
    small = g.abs() < s / 2
    assert small.any() and float((mean[small] - g[small].double()).abs().max()) < 3 * s / math.sqrt(rows)


def test_stochastic_levels_scale_and_reproducibility() -> None:
    g = normal((17, 5, 3), seed=4)
    for bits in (8, 4):
        levels = 2 ** (bits - 1) - 1
        a = StochasticQuantizer(bits).compress(g, generator=torch.Generator().manual_seed(1))
        b = StochasticQuantizer(bits).compress(g, generator=torch.Generator().manual_seed(1))
        other = StochasticQuantizer(bits).compress(g, generator=torch.Generator().manual_seed(2))
        assert a == b and a.data != other.data
        assert a.params["scale"] == pytest.approx(float(g.abs().max()) / levels)
        y = StochasticQuantizer(bits).decompress(a)
        q = y / a.params["scale"]
        assert torch.allclose(q, q.round(), atol=1e-4) and float(q.abs().max()) <= levels + 1e-4
        # every value rounds to one of its two neighbouring levels
        assert float((y - g).abs().max()) <= a.params["scale"] * (1 + 1e-4)
    # the codec's own generator is seeded: two fresh codecs agree without touching torch's global RNG
    before = torch.random.get_rng_state()
    assert StochasticQuantizer(4, seed=5).compress(g) == StochasticQuantizer(4, seed=5).compress(g)
    assert torch.equal(before, torch.random.get_rng_state())


def test_four_bit_nibble_layout() -> None:
    # rows 0 and 1 share a byte: row 0 in the high nibble, both shifted by 8
    g = torch.tensor([[7.0, -7.0], [0.0, 7.0], [-7.0, 0.0]])  # s = 1: no randomness on exact levels
    c = StochasticQuantizer(4).compress(g)
    assert c.params["scale"] == 1.0
    assert list(c.data) == [(15 << 4) | 8, (1 << 4) | 15, (1 << 4) | 8, (8 << 4) | 8]
    assert torch.equal(StochasticQuantizer(4).decompress(c), g)


def test_zero_gradient() -> None:
    for bits in (8, 4):
        c = StochasticQuantizer(bits).compress(torch.zeros(3, 4))
        assert c.params["scale"] == 0.0
        assert torch.equal(StochasticQuantizer(bits).decompress(c), torch.zeros(3, 4))


# --- ratios (Table 3) -------------------------------------------------------------------------


@pytest.mark.parametrize("k", [2, 3, 4])
def test_forward_ratio_close_to_32_over_k(k: int) -> None:
    x = big_activation()
    codec = MultiBitQuantizer(k)
    c = codec.compress(x)
    raw = x.numel() * 4
    assert raw / len(c.data) == pytest.approx(32 / k, rel=0.05)
    assert raw / c.nbytes() == pytest.approx(codec.estimated_ratio(BIG))
    if k == 2:
        assert raw / c.nbytes() >= 15  # Table 3: 15.93 for MobileNetV2's largest output


@pytest.mark.parametrize("bits", [8, 4])
def test_backward_ratio_close_to_32_over_bits(bits: int) -> None:
    g = big_activation()
    codec = StochasticQuantizer(bits)
    c = codec.compress(g)
    assert g.numel() * 4 / len(c.data) == pytest.approx(32 / bits, rel=0.05)
    assert g.numel() * 4 / c.nbytes() == pytest.approx(codec.estimated_ratio(BIG))


def test_estimated_ratio_matches_eq8_for_small_outputs() -> None:
    # A small latent output with a batch not divisible by 8: padding and params weigh more.
    shape = (12, 16, 4, 4)
    c = MultiBitQuantizer(2).compress(normal(shape))
    assert len(c.data) == 2 * 16 * 4 * 4 * 2
    assert MultiBitQuantizer(2).estimated_ratio(shape) == pytest.approx(4 * 12 * 256 / c.nbytes())
    assert Identity().estimated_ratio(shape) == pytest.approx(1.0, rel=1e-3)


def test_four_mib_activation_round_trip_timing() -> None:
    """Exercises the 4 MiB path (Table 3's largest MobileNetV2 output); timing is measured, not asserted."""
    x = torch.relu(normal(FOUR_MIB, seed=5))
    codec = MultiBitQuantizer(2)
    state = CodecState()
    start = time.perf_counter()
    y = codec.decompress(codec.compress(x, state=state))
    elapsed = time.perf_counter() - start
    assert y.shape == x.shape and elapsed >= 0


# --- shapes, dtypes, wire form and errors -----------------------------------------------------

ALL_CODECS = ["none", "mbq2", "mbq3", "mbq4", "sq8", "sq4"]


@pytest.mark.parametrize("wire_id", ALL_CODECS)
@pytest.mark.parametrize("shape", [(), (1,), (7,), (9, 3), (13, 2, 3, 3), (0, 4), (4, 0)])
def test_shape_and_dtype_preserved(wire_id: str, shape: tuple[int, ...]) -> None:
    codec = get_codec(wire_id)
    x = normal(shape)
    c = codec.compress(x)
    assert c.codec == wire_id and c.shape == shape and c.dtype == "float32"
    assert len(c.data) == codec.data_nbytes(shape)
    y = codec.decompress(from_wire(cbor2.loads(cbor2.dumps(to_wire(c)))))
    assert y.shape == x.shape and y.dtype == torch.float32


@pytest.mark.parametrize("wire_id", ALL_CODECS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes_come_back(wire_id: str, dtype: torch.dtype) -> None:
    x = normal((9, 4)).to(dtype)
    codec = get_codec(wire_id)
    y = codec.decompress(codec.compress(x))
    assert y.dtype == dtype and y.shape == x.shape
    if wire_id == "none":
        assert torch.equal(x, y)


def test_wire_round_trip_through_cbor() -> None:
    for wire_id in ALL_CODECS:
        c = get_codec(wire_id).compress(normal((10, 3, 2)))
        wire = to_wire(c)
        assert set(wire) == {"v", "codec", "shape", "dtype", "params", "data"}
        assert from_wire(cbor2.loads(cbor2.dumps(wire))) == c


def valid_wire(wire_id: str = "mbq2") -> dict[str, Any]:
    return to_wire(get_codec(wire_id).compress(normal((10, 3, 2))))


def with_(d: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**d, **changes}


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda: None, "must be a dict"),
        (lambda: [1, 2], "must be a dict"),
        (lambda: {"codec": "mbq2"}, "needs keys"),
        (lambda: with_(valid_wire(), extra=1), "needs keys"),
        (lambda: with_(valid_wire(), v=2), "format"),
        (lambda: with_(valid_wire(), v=True), "format"),
        (
            lambda: with_(valid_wire(), codec="zstd"),
            "unknown codec 'zstd'; known: mbq2, mbq3, mbq4, none, sq4, sq8",
        ),
        (lambda: with_(valid_wire(), codec=7), "unknown codec"),
        (lambda: with_(valid_wire(), shape="10x3x2"), "shape"),
        (lambda: with_(valid_wire(), shape=[10, -3, 2]), "shape"),
        (lambda: with_(valid_wire(), shape=[True, 3, 2]), "shape"),
        (lambda: with_(valid_wire(), shape=[2**40, 2**40]), "limit"),
        (lambda: with_(valid_wire(), shape=[17, 3, 2]), "needs 36 bytes, got 24"),
        (lambda: with_(valid_wire(), shape=[10, 3, 3]), "needs 36 bytes, got 24"),
        (lambda: with_(valid_wire(), dtype="int8"), "dtype"),
        (lambda: with_(valid_wire(), dtype=None), "dtype"),
        (lambda: with_(valid_wire(), data=valid_wire()["data"][:-1]), "needs 24 bytes, got 23"),
        (lambda: with_(valid_wire(), data=valid_wire()["data"] + b"\0"), "needs 24 bytes, got 25"),
        (lambda: with_(valid_wire(), data="abc"), "data must be bytes"),
        (lambda: with_(valid_wire(), params={"alpha": [1.0, 0.5]}), "keys"),
        (
            lambda: with_(valid_wire(), params={"alpha": [1.0], "bias": 0.0}),
            "needs 2 alpha coefficients, got 1",
        ),
        (lambda: with_(valid_wire(), params={"alpha": [1.0, math.nan], "bias": 0.0}), "finite"),
        (lambda: with_(valid_wire(), params={"alpha": [1.0, 0.5], "bias": "0"}), "finite"),
        (lambda: with_(valid_wire(), params={"alpha": [10**400, 0.5], "bias": 0.0}), "finite"),
        (lambda: with_(valid_wire(), params=[1.0]), "params"),
        (lambda: with_(valid_wire(), codec="mbq3"), "needs 3 alpha coefficients, got 2"),
        (lambda: with_(valid_wire(), codec="sq8"), "keys"),  # a foreign payload under another id
        (lambda: with_(valid_wire("sq4"), params={"scale": -1.0}), "scale must be >= 0"),
        (lambda: with_(valid_wire("sq8"), data=b""), "needs 60 bytes, got 0"),
        (lambda: with_(valid_wire("none"), params={"scale": 1.0}), "keys"),
    ],
)
def test_malformed_payloads_raise_compression_error(make: Any, needle: str) -> None:
    with pytest.raises(CompressionError, match=needle.replace("(", r"\(")):
        from_wire(make())


def test_decompress_validates_directly_built_payloads() -> None:
    c = MultiBitQuantizer(2).compress(normal((10, 3, 2)))
    for bad in (
        Compressed(c.codec, (10, 3, 3), c.dtype, c.params, c.data),
        Compressed(c.codec, c.shape, c.dtype, c.params, c.data[:5]),
        Compressed("mbq4", c.shape, c.dtype, c.params, c.data),
    ):
        with pytest.raises(CompressionError):
            MultiBitQuantizer(2).decompress(bad)


wire_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | st.binary(max_size=32),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(key=st.sampled_from(["v", "codec", "shape", "dtype", "params", "data"]), value=wire_values)
def test_any_corrupted_field_raises_only_compression_error(key: str, value: Any) -> None:
    d = with_(valid_wire(), **{key: value})
    try:
        c = from_wire(d)
    except CompressionError:
        return
    MultiBitQuantizer(2).decompress(c)  # whatever was accepted must decode


@settings(max_examples=100, deadline=None)
@given(value=wire_values)
def test_garbage_raises_only_compression_error(value: Any) -> None:
    with pytest.raises(CompressionError):
        from_wire(value)


def test_non_finite_input_is_refused() -> None:
    x = normal((4, 4))
    x[1, 2] = math.nan
    for wire_id in ("mbq2", "sq8"):
        with pytest.raises(CompressionError, match="1 non-finite values of 16"):
            get_codec(wire_id).compress(x)


def test_compression_error_is_a_protocol_error() -> None:
    assert issubclass(CompressionError, ProtocolError)


# --- registry, roles, schedule ----------------------------------------------------------------


def test_registry_and_roles() -> None:
    assert known_codecs() == tuple(sorted(ALL_CODECS))
    for wire_id in ALL_CODECS:
        assert get_codec(wire_id).wire_id == wire_id
    assert get_codec("mbq3").roles == {Role.ACTIVATION}
    assert get_codec("sq4").roles == {Role.GRADIENT}
    assert get_codec("none").roles == {Role.ACTIVATION, Role.GRADIENT}
    with pytest.raises(ValueError, match="already registered"):
        register(Identity)
    with pytest.raises(ValueError):
        MultiBitQuantizer(5)
    with pytest.raises(ValueError):
        StochasticQuantizer(2)
    assert isinstance(get_codec("mbq2"), Codec)


def test_bit_schedule_follows_the_learning_rate() -> None:
    schedule = BitSchedule.from_lr_milestones([30, 60, 90])
    assert [schedule.forward_bits(e) for e in (0, 29, 30, 59, 60, 95)] == [2, 2, 3, 3, 4, 4]
    assert [schedule.backward_bits(e) for e in (0, 29, 30, 95)] == [8, 8, 4, 4]
    assert schedule.wire_ids(0) == ("mbq2", "sq8") and schedule.wire_ids(61) == ("mbq4", "sq4")
    assert BitSchedule.fixed(32, 32).wire_ids(5) == ("none", "none")
    assert BitSchedule(forward=(2, 4), forward_epochs=(3,)).forward_bits(3) == 4
    for bad in (
        lambda: BitSchedule(forward=(5,)),
        lambda: BitSchedule(backward=(2,)),
        lambda: BitSchedule(forward_epochs=(5, 5)),
        lambda: BitSchedule(backward_epochs=(-1,)),
        lambda: wire_id_for(Role.GRADIENT, 2),
    ):
        with pytest.raises(ConfigError):
            bad()


def test_auto_bits_widest_code_the_link_can_hide() -> None:
    mib4 = 4 << 20
    # 4 MiB at 100 MB/s takes 42 ms: hidden behind 50 ms of compute, so no compression
    assert auto_bits(100e6, mib4, 0.05) == 32
    # 6.25 MB/s (50 Mbps): 32 bits take 0.67 s, 4 bits 84 ms, 3 bits 63 ms, 2 bits 42 ms
    assert auto_bits(6.25e6, mib4, 0.1) == 4
    assert auto_bits(6.25e6, mib4, 0.07) == 3
    assert auto_bits(6.25e6, mib4, 0.05) == 2
    assert auto_bits(6.25e6, mib4, 0.01) == 2  # the link is the bottleneck anyway: narrowest code
    assert auto_bits(6.25e6, mib4, 0.05, target=2.0) == 4  # allow transfers twice the compute time
    assert auto_bits(1e6, mib4, 1.0, choices=(8, 4)) == 4
    with pytest.raises(ValueError):
        auto_bits(0, mib4, 0.1)
    with pytest.raises(ValueError):
        auto_bits(1e6, mib4, 0.1, choices=())


def test_stage_ratio_counts_the_envelope_and_the_codec_parameters() -> None:
    from edgeagent.compression.stage import StageCodecs
    from edgeagent.protocol.messages import Activation
    from edgeagent.protocol.wire import encode

    codecs = StageCodecs()
    codecs.set_bits(2, 8)
    x = torch.randn(32, 128)  # a small activation: the envelope is not negligible beside it
    y = torch.zeros(32, dtype=torch.long)
    packed = codecs.activation(x, epoch=0)
    assert isinstance(packed, Compressed)
    payload = encode(
        Activation(run_id="r", plan_id=0, stage=0, batch_id=0, version=0, mode="train", x=packed, y=y),
        sender="central",
    )
    codecs.message_sent(len(payload))
    raw = encode(
        Activation(run_id="r", plan_id=0, stage=0, batch_id=0, version=0, mode="train", x=x, y=y),
        sender="central",
    )
    assert codecs.raw_bytes == 32 * 128 * 4
    assert codecs.sent_bytes > len(packed.data)  # the alphas and the header count too
    assert codecs.tensor_ratio < 16.0  # what the old metric (codes alone) reported
    assert codecs.ratio < codecs.tensor_ratio
    # The message ratio is what the link carries: the uncompressed message over the compressed one.
    assert codecs.ratio == pytest.approx(len(raw) / len(payload), rel=0.02)
