# Builds torchtpu._C: the C++ adapter linked with libtpurt (runtime/, built by its
# Makefile first; scripts/build.py drives both). Build without isolation so the pinned
# torch is the one compiled against:  pip install -e . --no-build-isolation
import os
import scipy_openblas32
from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
RUNTIME = os.path.join(ROOT, "runtime")
BLAS_LIB = scipy_openblas32.get_lib_dir()

ext_modules = []
if os.environ.get("TORCHTPU_METADATA_ONLY") != "1":
    ext_modules.append(
        CppExtension(
            "torchtpu._C",
            sources=[os.path.join("torchtpu", "csrc", f)
                     for f in ("device.cpp", "ops.cpp", "module.cpp", "site.cpp", "sparse.cpp")],
            include_dirs=[os.path.join(RUNTIME, "include")],
            extra_objects=[os.path.join(RUNTIME, "build", "libtpurt.a")],
            depends=[os.path.join(RUNTIME, "build", "libtpurt.a")],  # relink when it changes
            library_dirs=[BLAS_LIB],
            libraries=["scipy_openblas"],
            extra_link_args=[f"-Wl,-rpath,{BLAS_LIB}"],
            extra_compile_args=["-O2", "-g0"],
        )
    )

setup(
    name="torchtpu",
    version="0.1.0",
    description="A native PyTorch backend for TPU-class accelerators, runtime in C",
    packages=find_packages(include=["torchtpu", "torchtpu.*"]),
    ext_modules=ext_modules,
    cmdclass={"build_ext": BuildExtension},
    entry_points={"torch.backends": ["torchtpu = torchtpu:_autoload"],
                  "torch_dynamo_backends": ["tpu = torchtpu.compile:tpu_backend"]},
    python_requires=">=3.10",
)
