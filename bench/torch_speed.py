#!/usr/bin/env python3
"""torch_speed.py: the PyTorch side of bench/gpu_speed, on one GPU: each configuration trained
as an eager PyTorch user at their best would (no DistributedDataParallel on one GPU; NHWC
through channels_last; cudnn.benchmark = True; torch.autocast(bfloat16) for BF16, TF32 allowed
for TF32 and forbidden for FP32), or compiled with torch.compile beside it.

    python3 bench/torch_speed.py --configs resnet50:256:bf16,xception:128:bf16 [--compile]
        [--windows 3] [--steps 10] [--warmup 8] [--profile-ops 5]

A configuration is MODEL:BATCH:PRECISION (models: resnet50, xception at 224x224x3, and the seed
convnet at 28x28x1; precisions fp32, tf32, bf16). The models are the example model files built
by tests/tools/torch_graph.py (the PyTorch peer's), trained with their [train] optimizer (SGD
with momentum for the graph models, RMSprop for the ConvNet, as bench/torch_peer.py) on one
batch of random images made on the GPU before the timing (the best case for the data: none).
Steps are timed with CUDA events in --windows windows of --steps steps after --warmup steps
(cudnn.benchmark tries its algorithms in the first ones); the median window gives the step time.
Prints one JSON line per configuration as it finishes (a run cut short keeps the ones before):
the windows' step times, the median, images/s, the peak of torch.cuda.max_memory_allocated,
and with --profile-ops K, torch.profiler's operators over K steps (CUDA time per step, calls per
step, the top 40 by CUDA time)."""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_peer  # noqa: E402  (its model builders and the graph models' optimizer)


def build(model):
    """(module, input shape (C, H, W), classes, optimizer maker)."""
    if model == "convnet":
        net = torch_peer.convnet()
        opt = lambda p: torch.optim.RMSprop(p, 1e-3, alpha=0.9, eps=1e-7)  # Keras' rmsprop
        return net, (1, 28, 28), 10, opt
    net = torch_peer.graph(model, "224,224,3")
    h, w, c = net.in_shape
    classes = [m for m in net.modules() if isinstance(m, nn.Linear)][-1].out_features
    return net, (c, h, w), classes, lambda p: torch_peer.graph_sgd(model, p)


def run(cfg, a):
    model, batch, prec = cfg.split(":")
    batch = int(batch)
    torch.backends.cudnn.benchmark = True
    tf32 = prec == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    dev = torch.device("cuda")
    torch.manual_seed(0)
    net, shape, classes, make_opt = build(model)
    net = net.to(dev).to(memory_format=torch.channels_last)
    opt = make_opt(net.parameters())
    step_fn_net = torch.compile(net) if a.compile else net
    x = torch.rand((batch, *shape), device=dev).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, classes, (batch,), device=dev)
    amp = prec == "bf16"

    def step():
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(step_fn_net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    windows = []
    for _ in range(a.windows):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(a.steps):
            step()
        e1.record()
        e1.synchronize()
        windows.append(e0.elapsed_time(e1) / a.steps)
    med = statistics.median(windows)
    r = {"side": "torch.compile" if a.compile else "torch", "model": model, "batch": batch,
         "precision": prec, "step_ms_windows": [round(w, 4) for w in windows],
         "step_ms": round(med, 4), "images_per_s": round(batch / med * 1e3, 1),
         "peak_gpu_mem_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1),
         "warmup_s": round(warm_s, 2), "torch": torch.__version__,
         "cudnn": torch.backends.cudnn.version(), "gpu": torch.cuda.get_device_name(0)}
    if a.profile_ops:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(a.profile_ops):
                step()
            torch.cuda.synchronize()
        rows = []
        for ev in prof.key_averages():
            cuda_us = getattr(ev, "device_time_total", None)
            if cuda_us is None:
                cuda_us = getattr(ev, "cuda_time_total", 0)
            if cuda_us <= 0:
                continue
            rows.append({"op": ev.key, "cuda_ms_per_step": round(cuda_us / 1e3 / a.profile_ops, 4),
                         "calls_per_step": round(ev.count / a.profile_ops, 2),
                         "cpu_ms_per_step": round(ev.cpu_time_total / 1e3 / a.profile_ops, 4)})
        rows.sort(key=lambda d: -d["cuda_ms_per_step"])
        r["ops"] = rows[:40]
    print(json.dumps(r), flush=True)
    del net, opt, x, y, step_fn_net
    torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", required=True, help="MODEL:BATCH:PRECISION,...")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--steps", type=int, default=10, help="steps per timed window")
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--profile-ops", type=int, default=0, metavar="K",
                   help="torch.profiler's operator table over K more steps")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("SKIPPED: no usable GPU (torch.cuda.is_available() is False)", flush=True)
        sys.exit(77)
    for cfg in a.configs.split(","):
        if cfg.count(":") != 2 or cfg.split(":")[0] not in ("resnet50", "xception", "convnet") \
                or cfg.split(":")[2] not in ("fp32", "tf32", "bf16"):
            p.error(f"--configs: '{cfg}' is not MODEL:BATCH:PRECISION (resnet50, xception, "
                    "convnet; fp32, tf32, bf16)")
    for cfg in a.configs.split(","):
        run(cfg, a)


if __name__ == "__main__":
    main()
