"""Machine description and limits: lscpu model, cores, RAM; peak f32 FLOP/s (FMA loop, 1
core and all cores), peak bf16 FLOP/s (vdpbf16ps loop, where the CPU has AVX512-BF16) and
memory bandwidth (copy, triad) from bench/peak.c, built here with
the system cc. The FMA loop is built twice (-march=native and -mavx2 -mfma) and the faster
build, by its all-core rate, is the peak (on some CPUs 512-bit FMAs run at half rate)."""
import json
import os
import platform
import subprocess
import tempfile

from _timing import emit, progress

HERE = os.path.dirname(os.path.abspath(__file__))


def lscpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def ram_gib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    return 0.0


def run_peak(flags):
    with tempfile.TemporaryDirectory() as d:
        exe = os.path.join(d, "peak")
        r = subprocess.run(["cc", "-O3", *flags, "-pthread", os.path.join(HERE, "peak.c"), "-o", exe],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return None
        out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
        return json.loads(out)


def main():
    progress("machine limits (bench/peak.c)")
    runs = [(f, run_peak(f)) for f in (["-march=native"], ["-mavx2", "-mfma"])]
    runs = [(f, r) for f, r in runs if r]
    # chosen by the all-core figure (the one % of peak and MFU divide by): on CPUs whose
    # 512-bit FMAs are two 256-bit halves (Zen 4) both builds reach the same 1-core peak,
    # and choosing by that picked a build whose all-core run a neighbour had slowed
    # (122 GFLOP/s for both cores, 117 for one: GEMMs at "164% of peak")
    best = max(runs, key=lambda fr: fr[1]["flops_all"])
    res = dict(best[1])
    res["peak_flags"] = " ".join(best[0])
    for key in ("copy_1", "copy_all", "triad_1", "triad_all"):
        res[key] = max(r[key] for _, r in runs)
    # 0 where no build has AVX512-BF16 (vdpbf16ps) or AMX-BF16 (tdpbf16ps, also granted by the kernel)
    for key in ("bf16_flops_1", "bf16_flops_all", "amx_bf16_flops_1", "amx_bf16_flops_all"):
        res[key] = max(r.get(key, 0.0) for _, r in runs)
    res.update(model=lscpu_model(), ram_gib=ram_gib(), cores=os.cpu_count())
    emit({"machine": res})


if __name__ == "__main__":
    main()
