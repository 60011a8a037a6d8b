"""Every environment variable torchtpu reads, with its meaning and default. The C
runtime reads the ones marked (C) itself; they are listed here so there is one place to
look."""

ENV_VARS = {
    "TORCHTPU_NUM_DEVICES": "(C) number of host-driver devices (default 1; under torchrun, "
                            "LOCAL_WORLD_SIZE, so set_device(local_rank) works)",
    "TPU_VISIBLE_DEVICES": "(C) comma-separated device list; its length is the device count "
                           "when TORCHTPU_NUM_DEVICES is unset",
    "TORCHTPU_HBM_BYTES": "(C) per-device memory capacity in bytes (default: half of host RAM)",
    "TORCHTPU_EAGER_MODE": "defer_and_fuse (default), strict or debug",
    "TPU_LAUNCH_BLOCKING": "1: debug eager mode (launch-blocking with checks) unless "
                           "TORCHTPU_EAGER_MODE says otherwise; the C queue also blocks",
    "TORCHTPU_DEBUG_NAN": "debug mode's NaN/Inf check: raise (default), warn or off",
    "TORCHTPU_QUEUE_DEPTH": "(C) strict mode: queued items the host may run ahead of the "
                            "device before it waits, until half have run (default 32)",
    "TORCHTPU_NUM_THREADS": "(C) host-driver thread pool size (default: online CPUs; under "
                            "torchrun, their share: CPUs / LOCAL_WORLD_SIZE)",
    "TORCHTPU_CPU_THREADS": "PyTorch's CPU intra-op threads once the host driver is in use "
                            "(default: OMP_NUM_THREADS if set, else 1; their idle OpenMP "
                            "threads spin on the cores the runtime computes on)",
    "TORCHTPU_POOL_SPIN_US": "(C) microseconds an idle pool thread polls for work before it sleeps (default 50; 0: sleep at once)",
    "TORCHTPU_BF16_GEMM": "(C) bf16 x bf16 GEMM: 'native' (default: AMX tiles where the CPU has "
                          "them, else the AVX512-BF16 kernel where it has that), 'avx512' (the "
                          "AVX512-BF16 kernel even with AMX) or 'widen' (convert to f32 and call sgemm)",
    "TORCHTPU_GRAPH_MAX_NODES": "(C) defer_and_fuse: ops per graph before a size cut (default 4096)",
    "TORCHTPU_GRAPH_CUT_MACS": "(C) defer_and_fuse: multiply-adds of products (GEMM, convolution, "
                               "attention) a graph holds before the next product cuts it "
                               "(default 8e6; 0: never)",
    "TORCHTPU_QUEUE_BYTES": "(C) strict mode: bytes of outputs the queued items may hold before "
                            "the host waits (default 4 MiB)",
    "TORCHTPU_F32_GEMM": "(C) 'blas': f32 products on OpenBLAS even where the AVX-512 kernel "
                         "could run them (side-by-side runs)",
    "TORCHTPU_ATTN_KERNEL": "(C) 0: every attention head on the generic path instead of the "
                            "AVX-512 head kernel (side-by-side runs, bench/attention.py)",
    "TORCHTPU_CONV_WINOGRAD": "(C) 0: 3x3 convolutions without Winograd F(2x2, 3x3) (side-by-side runs)",
    "TORCHTPU_STREAM_MIN_BYTES": "(C) outputs from this size on are written with non-temporal "
                                 "stores (default: the last-level cache; 0 turns them off)",
    "TORCHTPU_HUGE_PAGES": "(C) 1: device blocks of 4 MiB and more on 2 MiB pages (default off: "
                           "slower first steps on the VMs measured)",
    "TORCHTPU_SCRATCH_CACHE": "(C) 0: kernels' large host scratch blocks go back to the C library "
                              "on free instead of being kept for reuse (side-by-side runs)",
    "TORCHTPU_VALIDATE_THREADS": "validation workers' PyTorch CPU threads (set by "
                                 "python -m torchtpu.validate --threads)",
    "TORCHTPU_VALIDATE_TIMEOUT": "validation workers' per-model seconds, which size the "
                                 "training re-check's budget (set by python -m torchtpu.validate "
                                 "--timeout)",
    "TORCHTPU_FALLBACK": "CPU fallback policy: 'warn' (default: run, warn once per op), "
                         "'allow' (run silently), 'error' (raise NotImplementedError)",
    "TORCHTPU_XLA_VENV": "benchmarks: the PyTorch/XLA venv that scripts/setup_xla.sh makes and "
                         "torchtpu.bench runs bench/xla_gpt.py in (default: "
                         "~/.cache/torchtpu/xla-venv-<hash of scripts/requirements-xla.txt>)",
    "TORCH_DEVICE_BACKEND_AUTOLOAD": "PyTorch's: 0 disables loading torchtpu on `import torch`",
}
