"""Every bench summary says which kind of box it was measured on."""

from __future__ import annotations

from hearthgate.deploy import box

AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 avx avx2 fma
processor\t: 1
model name\t: something else
flags\t\t: avx512f
"""
AVX512 = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: avx2 avx512f avx512bw avx512_vnni
"""


def test_reads_the_first_processors_model_and_vector_extensions() -> None:
    got = box.describe(AVX2)
    assert (got["cpu"], got["avx512"], got["avx512_bf16"]) == ("AMD EPYC", False, False)
    got = box.describe(AVX512)
    assert (got["cpu"], got["avx512"]) == ("Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz", True)
    assert isinstance(got["cores"], int)


def test_unreadable_cpuinfo_is_unknown_not_an_error() -> None:
    got = box.describe("")
    assert (got["cpu"], got["avx512"]) == ("unknown", False)


def test_report_line() -> None:
    b = {"cpu": "AMD EPYC", "cores": 2, "avx512": False, "avx512_bf16": False}
    assert box.line(b) == "Box: AMD EPYC, 2 cores, no AVX-512."
    assert box.line({**b, "avx512": True, "avx512_bf16": True}).endswith("AVX-512 with BF16.")
    assert box.line(None) == ""  # summaries written before boxes were recorded


def test_this_machine_is_described() -> None:
    got = box.describe()
    assert got["cpu"] != "" and got["cores"] and got["cores"] >= 1
