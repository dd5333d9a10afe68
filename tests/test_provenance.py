"""Which machine a run came from: the CPU line of the start-up output, the summary and
the metrics log (pal_hpc.io.provenance)."""

from pal_hpc.io.provenance import cpus_line, describe_cpu

ZEN3 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx avx2 fma bmi2

processor\t: 1
model name\t: something else
"""
ZEN4 = ZEN3.replace("model\t\t: 1", "model\t\t: 17").replace(
    "avx2 fma", "avx2 fma avx512f avx512bw avx512_bf16")
SKYLAKE = ZEN3.replace("avx2 fma", "avx2 fma avx512f avx512bw").replace(
    "AMD EPYC 7B13", "Intel(R) Xeon(R) Gold 6148")


def test_a_cpu_is_named_with_its_family_model_and_widest_vectors():
    assert describe_cpu(ZEN3, cpus=2) == \
        "AMD EPYC 7B13 (family 25 model 1), AVX2, no AVX-512, 2 CPUs"
    assert describe_cpu(ZEN4, cpus=2) == \
        "AMD EPYC 7B13 (family 25 model 17), AVX-512 with native bf16, 2 CPUs"
    assert describe_cpu(SKYLAKE, cpus=40) == \
        "Intel(R) Xeon(R) Gold 6148 (family 25 model 1), AVX-512, no native bf16, 40 CPUs"
    # Only the first processor's block counts; no flags at all: no vector claim.
    assert describe_cpu("model name\t: Some ARM core\n", cpus=4) == "Some ARM core, 4 CPUs"
    assert describe_cpu(ZEN3.replace("avx2 fma", "avx"), cpus=1).endswith(", no AVX2, 1 CPU")


def test_this_machines_description_names_its_cpu_count():
    text = describe_cpu()
    assert text and text.endswith((" CPUs", " 1 CPU")) and "\n" not in text


def test_the_start_up_line_groups_hosts_by_cpu():
    a = describe_cpu(ZEN3, cpus=2)
    b = describe_cpu(ZEN4, cpus=2)
    assert cpus_line({"n1": a}) == f"pal_hpc: CPU {a} (host n1)"
    assert cpus_line({"n1": a, "n2": b, "n3": a}) == \
        f"pal_hpc: CPU {a} (2 hosts n1, n3); {b} (host n2)"
    many = {f"n{i}": a for i in range(6)}
    assert cpus_line(many) == f"pal_hpc: CPU {a} (6 hosts n0, n1, n2, n3, ...)"
