"""Builds libtpurt (make) and the torchtpu._C extension in place, incrementally, and
registers the package (with its torch.backends entry point) in the active venv.
Serialized with a lock file so concurrent invocations don't trample each other."""
import fcntl
import json
import os
import pathlib
import subprocess
import sys

import scipy_openblas32

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, **kw):
    subprocess.run(cmd, check=True, cwd=ROOT, **kw)


def main():
    os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)
    with open(os.path.join(ROOT, "build", ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # The build imports torch; a half-built torchtpu must not be autoloaded by it.
        env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0", PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
        run(["make", "-s", "-C", "runtime", f"-j{os.cpu_count() or 2}",
             f"OPENBLAS_INC={scipy_openblas32.get_include_dir()}",
             f"OPENBLAS_LIB={scipy_openblas32.get_lib_dir()}"], env=env)
        env["MAX_JOBS"] = str(os.cpu_count() or 2)
        run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], env=env,
            stdout=subprocess.DEVNULL)
        # Package metadata (entry point for autoload) pointing at this checkout.
        try:
            import importlib.metadata as md
            dist = md.distribution("torchtpu")
            direct = json.loads(dist.read_text("direct_url.json") or "{}")
            registered = (direct.get("url") == pathlib.Path(ROOT).as_uri() and
                          {ep.group for ep in dist.entry_points} >= {"torch.backends", "torch_dynamo_backends"})
        except Exception:
            registered = False
        if not registered:
            run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                 "-e", "."], env=dict(env, TORCHTPU_METADATA_ONLY="1"))


if __name__ == "__main__":
    main()
