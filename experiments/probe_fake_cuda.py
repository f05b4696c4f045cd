"""Probe: does a CUDA build of torch make fake CUDA tensors on a machine with no NVIDIA driver?

    python -m venv /tmp/torchcuda && /tmp/torchcuda/bin/pip install torch   # a CUDA wheel
    /tmp/torchcuda/bin/python experiments/probe_fake_cuda.py

Each case runs in its own interpreter (a failure can abort the process) and prints what it got:
its output, or the last line of its error. The cases are what the meta recorder
(:mod:`allocsim.traces.record.torch.meta`) would need from ``FakeTensorMode`` to record on fake
CUDA tensors instead of meta ones: factories and ``.to("cuda")``, a GEMM, a training step
(backward and AdamW), the device's properties, streams, ``torch.autocast("cuda")``, and which
kernel ``F.scaled_dot_product_attention`` runs (the ATen ops a dispatch mode sees). The answer,
from torch 2.14.1+cu130 with no driver (docs/pytorch.md, "Fake CUDA tensors"), is that forward
ops work and a backward pass, streams, autocast and the device's properties do not, so the
recorder stays on meta.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

CASES = {
    "factories on 'cuda' and 'cuda:0'": """
        with FakeTensorMode():
            for name in ("cuda", "cuda:0"):
                x = torch.empty(1024, 1024, device=name)
                print(name, type(x).__name__, x.device, x.untyped_storage().nbytes())
    """,
    "Tensor.to('cuda') and a GEMM": """
        with FakeTensorMode():
            a = torch.empty(512, 256).to("cuda"); b = torch.empty(256, 128, device="cuda")
            c = a @ b
            print(c.device, tuple(c.shape), c.untyped_storage().nbytes())
    """,
    "a training step built under torch.device('cuda:0')": """
        import torch.nn as nn
        with FakeTensorMode(), torch.device("cuda:0"):
            m = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
            loss = m(torch.randn(8, 64)).pow(2).mean()
            print("forward", loss.device)
            loss.backward()
            torch.optim.AdamW(m.parameters()).step()
            print("backward and step")
    """,
    "Module.to('cuda:0') of a module built under the mode": """
        import torch.nn as nn
        with FakeTensorMode():
            m = nn.Linear(64, 64).to("cuda:0")
            print(m.weight.device)
    """,
    "device properties": """
        print("is_available", torch.cuda.is_available(), "count", torch.cuda.device_count())
        for call in (lambda: torch.cuda.get_device_properties(0),
                     lambda: torch.cuda.get_device_capability(0), torch.cuda.mem_get_info):
            try:
                print(call())
            except Exception as e:
                print(type(e).__name__, str(e).splitlines()[0])
    """,
    "streams and autocast('cuda')": """
        import warnings
        warnings.simplefilter("always")
        with FakeTensorMode():
            for call in (torch.cuda.Stream, torch.cuda.current_stream):
                try:
                    print(call())
                except Exception as e:
                    print(type(e).__name__, str(e).splitlines()[0])
            with warnings.catch_warnings(record=True) as caught, \\
                    torch.autocast("cuda", dtype=torch.bfloat16):
                a = torch.empty(64, 64, device="cuda:0")
                print("autocast matmul dtype", (a @ a).dtype, [str(w.message) for w in caught])
    """,
    "which kernel F.scaled_dot_product_attention runs": """
        import torch.nn.functional as F
        from torch.utils._python_dispatch import TorchDispatchMode
        class Ops(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func.namespace == "aten":
                    ops.append(func.__name__)
                return func(*args, **(kwargs or {}))
        for dtype in (torch.float32, torch.bfloat16):
            ops = []
            with FakeTensorMode():
                q = torch.empty(8, 16, 1024, 128, device="cuda:0", dtype=dtype,
                                requires_grad=True)
                with Ops():
                    F.scaled_dot_product_attention(q, q, q, is_causal=True)
            print(dtype, "->", ", ".join(dict.fromkeys(ops)))
    """,
    "the flash and efficient kernels called directly": """
        aten = torch.ops.aten
        with FakeTensorMode():
            q = torch.empty(8, 16, 1024, 128, device="cuda:0", dtype=torch.bfloat16)
            out = aten._scaled_dot_product_flash_attention(q, q, q, 0.0, True, False)
            print("flash", tuple(out[0].shape), tuple(out[1].shape), out[0].device)
            f = q.float()
            out = aten._scaled_dot_product_efficient_attention(f, f, f, None, True, 0.0, True)
            print("efficient", tuple(out[0].shape), tuple(out[1].shape), out[0].device)
    """,
}

PRELUDE = "import torch\nfrom torch._subclasses.fake_tensor import FakeTensorMode\n"


def main() -> int:
    import torch
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"cuda.is_available() {torch.cuda.is_available()}")
    for name, body in CASES.items():
        done = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
                              capture_output=True, text=True, timeout=600)
        lines = [line for line in (done.stdout + done.stderr).splitlines()
                 if "NumPy" not in line and "_conversion_method_template" not in line]
        if done.returncode != 0:  # the traceback's last line says what failed
            lines = [*done.stdout.splitlines(), *lines[-1:]]
        print(f"== {name}: exit status {done.returncode}")
        for line in lines:
            print("   ", line[:300])
    return 0


if __name__ == "__main__":
    sys.exit(main())
