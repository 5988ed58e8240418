"""The CPU identity a collection records (pure: /proc/cpuinfo text in, a string out)."""

from __future__ import annotations

from edgeagent.predictor.machine import cpu_identity, cpu_model

EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
stepping\t: 1
flags\t\t: fpu sse4_2 avx avx2 avx512f avx512bw
processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 26
model name\t: AMD EPYC
"""

PI4 = """processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm crc32 cpuid
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x0
CPU part\t: 0xd08
processor\t: 1
Hardware\t: BCM2835
Model\t\t: Raspberry Pi 4 Model B Rev 1.4
"""


def test_an_x86_cpu_is_its_family_model_and_widest_vector_isa() -> None:
    assert cpu_identity(EPYC) == "vendor_id=AuthenticAMD cpu family=25 model=17 stepping=1 isa=avx512f"
    assert cpu_model(EPYC) == "AMD EPYC"


def test_an_arm_cpu_is_its_implementer_and_part() -> None:
    assert cpu_identity(PI4) == "CPU implementer=0x41 CPU part=0xd08 CPU variant=0x0 isa=asimd"
    assert cpu_model(PI4) == "BCM2835"


def test_an_unreadable_cpuinfo_is_unknown() -> None:
    assert cpu_identity("nothing here") == "unknown"
