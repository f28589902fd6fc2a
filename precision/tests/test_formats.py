"""Known-answer tests of the reference MX cast, derived by hand from OCP MX v1.0 §6.3."""
import pytest
import torch

from gem_precision import MXTensor, to_mx, to_mx_reference

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2


def codes(t: MXTensor) -> list[int]:
    return t.data.view(torch.uint8).flatten().tolist()


def block(*head: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """One 32-element block: `head` then zeros."""
    x = torch.zeros(32, dtype=torch.float32)
    x[: len(head)] = torch.tensor(head, dtype=torch.float32)
    return x.to(dtype)


@pytest.mark.parametrize("mode", ["floor", "rceil"])
@pytest.mark.parametrize("elem", [E4, E5])
def test_zero_block_scale_zero(mode: str, elem: torch.dtype) -> None:
    t = to_mx(torch.zeros(2, 64), elem_dtype=elem, scale_mode=mode)
    assert t.scale.tolist() == [[0, 0], [0, 0]]
    assert set(codes(t)) == {0}
    assert t.scale.dtype == torch.uint8 and t.data.dtype == elem and t.data.shape == (2, 64)


@pytest.mark.parametrize("mode", ["floor", "rceil"])
def test_one(mode: str) -> None:
    # amax 1 = 2^0: floor -> 2^(0-8), byte 119; rceil: 1/448 -> 2^-8 too. 1/2^-8 = 256 = 0x78.
    t = to_mx(block(1.0, -1.0, 0.5), scale_mode=mode)
    assert t.scale.tolist() == [119]
    assert codes(t)[:4] == [0x78, 0xF8, 0x70, 0x00]
    # E5M2: 2^(0-15), byte 112; 2^15 = exp field 30 -> 0x78.
    t5 = to_mx(block(1.0), elem_dtype=E5, scale_mode=mode)
    assert t5.scale.tolist() == [112] and codes(t5)[0] == 0x78


def test_saturation_floor_vs_rceil() -> None:
    # amax 449: floor -> 2^0 (byte 127), 449 saturates to 448 (0x7E); so do 480 and 511.
    t = to_mx(block(449.0, 480.0, 511.0, -500.0), scale_mode="floor")
    assert t.scale.tolist() == [127]
    assert codes(t)[:4] == [0x7E, 0x7E, 0x7E, 0xFE]
    # rceil: 511/448 > 1 -> 2^1 (byte 128): 449/2 = 224.5 -> 224 (0x76), 240 = 0x77, 255.5 -> 256 = 0x78.
    t = to_mx(block(449.0, 480.0, 511.0), scale_mode="rceil")
    assert t.scale.tolist() == [128]
    assert codes(t)[:3] == [0x76, 0x77, 0x78]


def test_rceil_boundary_at_max() -> None:
    # amax = 1.75 exactly = 448 * 2^-8 -> rceil 2^-8 (byte 119), 1.75 -> 448 (0x7E).
    t = to_mx(block(1.75), scale_mode="rceil")
    assert t.scale.tolist() == [119] and codes(t)[0] == 0x7E
    # One ulp above 1.75 -> 2^-7 (byte 120), -> 224.00002 -> 224 (0x76). floor keeps 2^-8 and saturates.
    up = torch.nextafter(torch.tensor(1.75), torch.tensor(2.0)).item()
    t = to_mx(block(up), scale_mode="rceil")
    assert t.scale.tolist() == [120] and codes(t)[0] == 0x76
    t = to_mx(block(up), scale_mode="floor")
    assert t.scale.tolist() == [119] and codes(t)[0] == 0x7E


def test_round_to_nearest_even() -> None:
    # 448 in the block -> scale 2^0. In [1, 2) the E4M3 step is 1/8.
    # 1.0625 is halfway 1.0 (0x38) / 1.125 (0x39) -> even 0x38; 1.1875 -> 1.25 (0x3A);
    # 1.07 -> 1.125 (0x39). Subnormals: step 2^-9; 2^-10 is a tie -> 0, 3*2^-10 -> 2 (0x02).
    t = to_mx(block(448.0, 1.0625, 1.1875, 1.07, 2.0**-10, 3 * 2.0**-10, 2.0**-9, -(2.0**-9), -(2.0**-11)))
    assert t.scale.tolist() == [127]
    assert codes(t)[:9] == [0x7E, 0x38, 0x3A, 0x39, 0x00, 0x02, 0x01, 0x81, 0x80]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_subnormal_inputs_exact(dtype: torch.dtype) -> None:
    # amax 2^-119 -> scale 2^-127 (byte 0, not clamped). 2^-130 (subnormal in fp32 and bf16)
    # -> 2^-3 = 0x20; 2^-126 -> 2 = 0x40; 2^-133 -> 2^-6 (min normal, 0x08).
    t = to_mx(block(2.0**-119, 2.0**-130, 2.0**-126, 2.0**-133, dtype=dtype))
    assert t.scale.tolist() == [0]
    assert codes(t)[:4] == [0x78, 0x20, 0x40, 0x08]
    # amax itself subnormal: the exponent clamps at -127 (byte 0) for both rules.
    for mode in ("floor", "rceil"):
        t = to_mx(block(2.0**-128, 2.0**-131, dtype=dtype), scale_mode=mode)
        # 2^-128 * 2^127 = 0.5 (exp field -1+7 = 6 -> 0x30); 2^-131 -> 2^-4 (field 3 -> 0x18).
        assert t.scale.tolist() == [0] and codes(t)[:2] == [0x30, 0x18]


def test_powers_of_two_at_block_boundaries() -> None:
    x = torch.cat([torch.full((32,), 2.0**-3), torch.full((32,), 2.0**5), torch.full((32,), -(2.0**100))])
    t = to_mx(x)
    assert t.scale.tolist() == [127 - 3 - 8, 127 + 5 - 8, 127 + 100 - 8]
    assert codes(t) == [0x78] * 64 + [0xF8] * 32
    assert torch.equal(t.dequantize(), x)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_inf_blocks(bad: float) -> None:
    x = torch.ones(2, 32)
    x[1, 7] = bad
    t = to_mx(x)
    assert t.scale.tolist() == [[119], [255]]
    assert codes(t)[:32] == [0x78] * 32 and codes(t)[32:] == [0x7F] * 32
    d = t.dequantize()
    assert torch.equal(d[0], x[0]) and d[1].isnan().all()


@pytest.mark.parametrize("elem", [E4, E5])
def test_every_code_round_trips_and_ties_go_even(elem: torch.dtype) -> None:
    # With the format max in the block the scale is 2^0, so each finite code must come back
    # unchanged, and the midpoint of two neighbours must go to the one with an even code.
    allc = torch.arange(256, dtype=torch.uint8).view(elem).float()
    pos = allc[:128][allc[:128].isfinite()]  # codes 0x00 .. max
    vals = torch.cat([pos, -pos])
    mx = torch.finfo(elem).max
    x = torch.cat([vals, torch.full(((-len(vals)) % 31,), 0.0)]).reshape(-1, 31)
    x = torch.cat([torch.full((x.shape[0], 1), mx), x], dim=1)
    t = to_mx(x, elem_dtype=elem)
    assert (t.scale == 127).all()
    assert torch.equal(t.dequantize(), x)
    mids = (pos[:-1] + pos[1:]) / 2
    xm = torch.cat([mids, torch.zeros((-len(mids)) % 31)]).reshape(-1, 31)
    xm = torch.cat([torch.full((xm.shape[0], 1), mx), xm], dim=1)
    got = to_mx(xm, elem_dtype=elem).data.view(torch.uint8)[:, 1:].flatten()[: len(mids)].int()
    lo = torch.arange(len(mids), dtype=torch.int32)
    assert torch.equal(got, torch.where(lo % 2 == 0, lo, lo + 1))


def test_dims_padding_and_shapes() -> None:
    x = torch.randn(3, 64, 5)
    t = to_mx(x, dim=1)
    assert t.data.shape == (3, 64, 5) and t.scale.shape == (3, 2, 5) and t.dim == 1
    r = to_mx_reference(x.transpose(1, 2).contiguous(), dim=-1)
    assert torch.equal(t.data.view(torch.uint8), r.data.view(torch.uint8).transpose(1, 2))
    y = torch.randn(4, 40)
    with pytest.raises(ValueError, match="multiple of"):
        to_mx(y)
    p = to_mx(y, pad=True)
    assert p.scale.shape == (4, 2) and p.data.shape == (4, 40)
    # Zero padding never changes a scale: the padded cast equals the cast of the padded tensor.
    yp = torch.nn.functional.pad(y, (0, 24))
    assert torch.equal(p.data.view(torch.uint8), to_mx(yp).data.view(torch.uint8)[:, :40])
    e = to_mx(torch.zeros(0, 64))
    assert e.data.shape == (0, 64) and e.scale.shape == (0, 2)


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="dtype"):
        to_mx(torch.ones(32, dtype=torch.int32))
    with pytest.raises(TypeError, match="elem_dtype"):
        to_mx(torch.ones(32), elem_dtype=torch.float16)
    with pytest.raises(ValueError, match="scale_mode"):
        to_mx(torch.ones(32), scale_mode="ceil")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="backend"):
        to_mx(torch.ones(32), backend="cuda")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dim"):
        to_mx(torch.ones(32), dim=2)


def test_dequantize_matches_scale_times_element() -> None:
    x = torch.randn(8, 64) * 1000
    t = to_mx(x, scale_mode="rceil")
    s = torch.exp2(t.scale.float() - 127).repeat_interleave(32, dim=1)
    assert torch.equal(t.dequantize(), t.data.float() * s)
    assert t.dequantize(torch.bfloat16).dtype == torch.bfloat16
    # rceil never saturates: |x| / scale <= 448 for every element.
    assert ((x.abs() / s) <= 448).all()
