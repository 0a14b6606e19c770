"""torch_gpt: the PyTorch twin of an mgtrain GPT model file (examples/gpt-bytes.cfg), trained as a
PyTorch user trains it (nanoGPT's model, DistributedDataParallel over gloo, one process per rank),
for the language-model benchmarks: bench/lm_peer (tokens per second) and bench/lm_learn (what the
same model learns in the same steps).

    python3 torch_gpt.py --model examples/gpt-bytes.cfg --count-params
    python3 torch_gpt.py --model examples/gpt-bytes.cfg --data synthetic --world 2 \\
        --batch-size 16 --max-steps 12 --warmup 2
    python3 torch_gpt.py --model examples/gpt-bytes.cfg --save-init init.safetensors --init-only
    python3 torch_gpt.py --model examples/gpt-bytes.cfg --data DIR --world 2 --epochs 1 \\
        --init-weights init.safetensors

The model is the file's, read by its own small reader (context, vocab, channels, blocks, heads,
the MLP's width and GELU, layer-norm epsilon, each dense layer's init_std): nanoGPT's GPT with
torch.nn.functional.scaled_dot_product_attention (is_causal=True), nn.GELU(approximate='tanh'),
an output layer tied to the token table, and mgtrain's initialisation (normal with each layer's
init_std, zero biases, unit gains). Its tensors carry Hugging Face's GPT-2 names and layouts in
safetensors files (the [in][out] Conv1D layout of the four dense layers of a block), so that
--save-init writes a file `mgtrain train --init-weights` starts from and --init-weights reads
one mgtrain wrote: both sides then start from the same weights.

Training follows the model file's [train] section as mgtrain runs it: AdamW (betas beta_1 and
beta_2, epsilon, decoupled weight decay on the tensors of two or more dimensions only), the
linear warm-up over warmup_steps then cosine decay to lr_min over the rest of the epochs
(src/schedule.c: the rate at step t is max(lr_min, cosine(t)) times (t + 1) / warmup during the
warm-up), the mean gradient clipped to global norm clip_norm. With --data DIR (token shards:
mgtrain convert --text) the windows are mgtrain's, in mgtrain's order: window w of a shard is
its tokens [w T, w T + T + 1), an epoch is the permutation of all windows that src/data/shard.c
draws from (seed, epoch) (SplitMix64, Fisher-Yates from the top; ported below), each global
batch is split over the ranks in contiguous parts, and the last, shorter batch of an epoch is
kept; each rank's loss is weighted by its share of the global batch, so the gradient DDP averages
is the global batch's mean as mgtrain's is. At the end the whole validation split is evaluated
(every window, in order): its loss, and bits per token (per byte for a vocabulary of 256).
--data synthetic draws random tokens each step (speed runs).

Prints one JSON line on rank 0: steps, tokens/s over the steps after --warmup (rank 0's wall
clock), the CPU seconds of those steps summed over the ranks (each process's, all its threads),
and with --data DIR the final validation loss and bits. Standard library, numpy and torch only.
"""
import argparse, json, math, os, re, struct, sys, time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

sys.dont_write_bytecode = True  # no __pycache__ in bench/


# ---- the model file -----------------------------------------------------------------------
def read_cfg(path):
    """The GPT of a model file: its sizes and [train] keys. Sections are read in order; the
    sections between [repeat] and [end] are one block, `count` times."""
    sections, repeat, in_block = [], 0, False
    for raw in open(path).read().splitlines():
        line = re.split(r"[;#]", raw, 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"\[(\w+)\]", line)
        if m:
            name = m.group(1)
            if name == "repeat":
                in_block = True
            elif name == "end":
                in_block = False
            sections.append({"_type": name, "_block": in_block and name != "repeat"})
            continue
        k, v = (x.strip() for x in line.split("=", 1))
        sections[-1][k] = v
    get = lambda t: [s for s in sections if s["_type"] == t]
    rep = get("repeat")
    repeat = int(rep[0]["count"]) if rep else 1
    block = [s for s in sections if s["_block"]]
    dense = [s for s in block if s["_type"] == "dense"]
    if len(dense) != 4 or len(get("attention")) != 1:
        raise SystemExit(f"{path}: the block between [repeat] and [end] must be GPT-2's (four "
                         "[dense] layers: c_attn, c_proj, c_fc, c_proj; one [attention])")
    inp, emb = get("input")[0], get("embedding")[0]
    acts = [s.get("activation", "") for s in dense]
    lns = get("layernorm")
    std = lambda s: float(s.get("init_std", "0.02"))
    cfg = {
        "context": int(inp["context"]), "vocab": int(inp["vocab"]), "n_embd": int(emb["units"]),
        "n_layer": repeat, "n_head": int(get("attention")[0]["heads"]),
        "n_inner": int(dense[2]["units"]), "gelu": "tanh" if "gelu_tanh" in acts else "none",
        "ln_eps": float(lns[0].get("epsilon", "1e-5")) if lns else 1e-5,
        "std": {"c_attn": std(dense[0]), "attn_proj": std(dense[1]), "c_fc": std(dense[2]),
                "mlp_proj": std(dense[3]), "wte": float(emb.get("init_std", "0.02"))},
        "train": (get("train") or [{}])[0],
    }
    return cfg


def attention(q, k, v):
    """Causal attention: PyTorch 2's fused kernel, or its formula where that is missing (Debian's
    PyTorch 1.13, which the tests run this file on)."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        C = c["n_embd"]
        self.n_head = c["n_head"]
        self.ln_1 = nn.LayerNorm(C, eps=c["ln_eps"])
        self.c_attn, self.attn_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=c["ln_eps"])
        self.c_fc, self.mlp_proj = nn.Linear(C, c["n_inner"]), nn.Linear(c["n_inner"], C)
        self.gelu = nn.GELU(approximate="tanh")

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = attention(q, k, v)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(self.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.wte = nn.Embedding(c["vocab"], c["n_embd"])
        self.wpe = nn.Embedding(c["context"], c["n_embd"])
        self.h = nn.ModuleList(Block(c) for _ in range(c["n_layer"]))
        self.ln_f = nn.LayerNorm(c["n_embd"], eps=c["ln_eps"])
        with torch.no_grad():  # mgtrain's initialisation: normal(0, init_std), zero biases
            for e in (self.wte, self.wpe):
                e.weight.normal_(0.0, c["std"]["wte"])
            for b in self.h:
                for name in ("c_attn", "attn_proj", "c_fc", "mlp_proj"):
                    lin = getattr(b, name)
                    lin.weight.normal_(0.0, c["std"][name])
                    lin.bias.zero_()

    def forward(self, idx):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # the output layer tied to the table


def params(net):
    return sum(p.numel() for p in net.parameters() if p.requires_grad)


# ---- Hugging Face GPT-2 names and layouts, in safetensors ----------------------------------
HF_DENSE = {"c_attn": "attn.c_attn", "attn_proj": "attn.c_proj", "c_fc": "mlp.c_fc",
            "mlp_proj": "mlp.c_proj"}


def hf_params(net):
    """{Hugging Face name: (parameter, whether the file holds it transposed)}."""
    out = {"transformer.wte.weight": (net.wte.weight, False),
           "transformer.wpe.weight": (net.wpe.weight, False),
           "transformer.ln_f.weight": (net.ln_f.weight, False),
           "transformer.ln_f.bias": (net.ln_f.bias, False)}
    for i, b in enumerate(net.h):
        p = f"transformer.h.{i}."
        for ln in ("ln_1", "ln_2"):
            out[p + ln + ".weight"] = (getattr(b, ln).weight, False)
            out[p + ln + ".bias"] = (getattr(b, ln).bias, False)
        for name, hf in HF_DENSE.items():
            out[p + hf + ".weight"] = (getattr(b, name).weight, True)  # Conv1D's [in][out]
            out[p + hf + ".bias"] = (getattr(b, name).bias, False)
    return out


def hf_tensors(net):
    """{Hugging Face name: float32 numpy array}, in the file's layouts."""
    return {k: (w.t() if tr else w).detach().float().contiguous().numpy()
            for k, (w, tr) in hf_params(net).items()}


def load_hf(net, tensors):
    """Copies {Hugging Face name: array} into the model; every tensor of either must match."""
    want = hf_params(net)
    if set(want) != set(tensors):
        raise SystemExit("the weights file's tensors are not this model's: missing "
                         f"{sorted(set(want) - set(tensors))[:4]}, unused "
                         f"{sorted(set(tensors) - set(want))[:4]}")
    with torch.no_grad():
        for k, (w, tr) in want.items():
            v = torch.from_numpy(tensors[k])
            v = v.t() if tr else v
            if tuple(v.shape) != tuple(w.shape):
                raise SystemExit(f"{k}: shape {tuple(tensors[k].shape)} in the file does not "
                                 "fit this model")
            w.copy_(v)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        if v["dtype"] != "F32":
            raise SystemExit(f"{path}: {k} is {v['dtype']}; float32 tensors only")
        b, e = v["data_offsets"]
        out[k] = np.frombuffer(data[b:e], dtype="<f4").reshape(v["shape"]).copy()
    return out


def write_safetensors(path, tensors):
    """Written whole or not at all (a temporary file, then a rename)."""
    head, off = {}, 0
    for k in sorted(tensors):
        n = tensors[k].size * 4
        head[k] = {"dtype": "F32", "shape": list(tensors[k].shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(head, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for k in sorted(tensors):
            f.write(np.ascontiguousarray(tensors[k], dtype="<f4").tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---- mgtrain's data order ------------------------------------------------------------------
M64 = (1 << 64) - 1
SHARD_PURPOSE = 0x5348554646  # "SHUFF", src/data/shard.c


def mix64(x):  # src/util.h: SplitMix64's finaliser
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def permutation(seed, epoch, n):
    """mgt_shard_permutation: Fisher-Yates from the top, j = high half of rand64(key, i) (i + 1)."""
    key = mix64(mix64(mix64(seed) ^ SHARD_PURPOSE) ^ epoch)
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        j = (mix64(key ^ mix64(i)) * (i + 1)) >> 64
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def shard_range(total, rank, world):  # mgt_shard_range
    q, r = divmod(total, world)
    return rank * q + min(rank, r), q + (1 if rank < r else 0)


def read_tokens(path):
    """An llm.c shard (256 int32 header: magic 20240520, version 1 or 2, count) or nanoGPT's
    raw uint16 tokens."""
    raw = np.fromfile(path, dtype=np.uint8)
    head = raw[:1024].view("<i4") if raw.size >= 1024 else None
    if head is not None and head[0] == 20240520:
        dt = "<u2" if head[1] == 1 else "<u4"
        return raw[1024:].view(dt)[: head[2]].astype(np.int64)
    return raw.view("<u2").astype(np.int64)


def token_windows(folder, split, T):
    """The windows of a split's shards (files *train*.bin or *val*.bin, in name order), as
    (tokens, start) pairs in mgtrain's window order."""
    files = sorted(f for f in os.listdir(folder) if f.endswith(".bin") and split in f)
    if not files:
        raise SystemExit(f"{folder}: no *{split}*.bin token shards")
    shards = [read_tokens(os.path.join(folder, f)) for f in files]
    return shards, [(s, w * T) for s, tok in enumerate(shards)
                    for w in range((len(tok) - 1) // T if len(tok) > 1 else 0)]


def lr_at(t, tr, steps_per_epoch, epochs):
    """src/schedule.c's rate at step t for lr_schedule = cosine (or constant)."""
    base = float(tr.get("learning_rate", "0.001"))
    warm = int(tr.get("warmup_steps", "0"))
    if tr.get("lr_schedule", "constant") == "cosine":
        lo = float(tr.get("lr_min", "0"))
        cos_steps = max(1.0, epochs * steps_per_epoch - warm)
        u = min(max(float(t - warm), 0.0), cos_steps)
        lr = max(lo, lo + (base - lo) * 0.5 * (1.0 + math.cos(math.pi * u / cos_steps)))
    else:
        lr = base
    return lr * (t + 1) / warm if t < warm else lr


# ---- training ------------------------------------------------------------------------------
def worker(rank, a):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(a.port))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // a.world))
    dist.init_process_group("gloo", rank=rank, world_size=a.world)
    c = read_cfg(a.model)
    tr = c["train"]
    T, V = c["context"], c["vocab"]
    torch.manual_seed(a.seed)
    net = GPT(c)
    if a.init_weights:
        load_hf(net, read_safetensors(a.init_weights))
    if a.save_init and rank == 0:
        write_safetensors(a.save_init, hf_tensors(net))
    model = nn.parallel.DistributedDataParallel(net)
    decay = [p for p in net.parameters() if p.dim() >= 2]
    rest = [p for p in net.parameters() if p.dim() < 2]
    wd = float(tr.get("weight_decay", "0")) if tr.get("optimizer", "adam") == "adamw" else 0.0
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=float(tr.get("learning_rate", "0.001")),
                            betas=(float(tr.get("beta_1", "0.9")), float(tr.get("beta_2", "0.999"))),
                            eps=float(tr.get("epsilon", "1e-7")))
    clip = float(tr.get("clip_norm", "0"))
    B = a.batch_size
    synthetic = a.data == "synthetic"
    if synthetic:
        n = a.synthetic_samples
        gen = torch.Generator().manual_seed(a.seed + rank)
    else:
        shards, wins = token_windows(a.data, "train", T)
        n = len(wins)
    spe = -(-n // B)  # steps per epoch: the last, shorter batch is kept
    steps, seen, t0, c0, losses = 0, 0, None, None, []
    done = False
    for epoch in range(a.epochs):
        perm = None if synthetic else permutation(a.seed, epoch, n)
        for s in range(spe):
            if steps == a.warmup:
                t0, c0, seen = time.perf_counter(), time.process_time(), 0
            gb = min(B, n - s * B)
            first, cnt = shard_range(gb, rank, a.world)
            if synthetic:
                xy = torch.randint(0, V, (cnt, T + 1), generator=gen)
            else:
                ids = perm[s * B + first: s * B + first + cnt]
                xy = torch.from_numpy(np.stack([shards[k][o:o + T + 1] for k, o in
                                                (wins[i] for i in ids)]))
            for g in opt.param_groups:
                g["lr"] = lr_at(steps, tr, spe, a.epochs)
            logits = model(xy[:, :-1])
            # this rank's mean, weighted by its share: DDP's average is then the global mean
            loss = F.cross_entropy(logits.reshape(-1, V), xy[:, 1:].reshape(-1)) * (
                cnt * a.world / gb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
            opt.step()
            if a.log_losses:  # the global batch's mean loss (each rank's weighted share)
                lv = loss.detach().double() / a.world
                dist.all_reduce(lv)
                losses.append(round(float(lv), 6))
            steps += 1
            seen += gb
            if a.max_steps and steps >= a.max_steps:
                done = True
                break
        if done:
            break
    dt = time.perf_counter() - (t0 or time.perf_counter())
    cpu = torch.tensor([time.process_time() - (c0 or time.process_time())], dtype=torch.float64)
    dist.all_reduce(cpu)
    val = None
    if not synthetic and not a.no_validation:
        vshards, vwins = token_windows(a.data, "val", T)
        first, cnt = shard_range(len(vwins), rank, a.world)
        tot = torch.zeros(2, dtype=torch.float64)
        net.eval()
        with torch.no_grad():
            for i in range(first, first + cnt, 32):
                xy = torch.from_numpy(np.stack([vshards[k][o:o + T + 1] for k, o in
                                                vwins[i:min(i + 32, first + cnt)]]))
                lo = F.cross_entropy(net(xy[:, :-1]).reshape(-1, V), xy[:, 1:].reshape(-1),
                                     reduction="sum")
                tot += torch.tensor([lo.item(), xy[:, 1:].numel()], dtype=torch.float64)
        dist.all_reduce(tot)
        vl = float(tot[0] / tot[1])
        val = {"val_loss": vl, "val_bits_per_token": vl / math.log(2), "val_windows": len(vwins)}
    if rank == 0:
        print(json.dumps({
            "peer": "torch-ddp", "torch": torch.__version__, "model": a.model, "world": a.world,
            "global_batch": B, "context": T, "threads": torch.get_num_threads(),
            "params": params(net), "steps": steps,
            "tokens_per_s": float(f"{seen * T / dt:.4g}") if dt > 0 else None,
            "cpu_s": round(float(cpu[0]), 3), "wall_s": round(dt, 3),
            "timed_steps": steps - a.warmup, **(val or {}),
            **({"losses": losses} if a.log_losses else {})}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="examples/gpt-bytes.cfg", help="a GPT model file")
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=None, help="global batch of sequences "
                   "(default: the model file's batch_size)")
    p.add_argument("--epochs", type=int, default=None, help="default: the model file's epochs")
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--warmup", type=int, default=0, help="steps left out of the timing")
    p.add_argument("--data", default="synthetic", help="a folder of token shards, or synthetic")
    p.add_argument("--synthetic-samples", type=int, default=60000,
                   help="sequences in an epoch of --data synthetic (mgtrain's default)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--port", type=int, default=29611)
    p.add_argument("--init-weights", default=None, help="start from these weights (Hugging "
                   "Face GPT-2 names and layouts, safetensors)")
    p.add_argument("--save-init", default=None, help="write the initial weights there (the same "
                   "names and layouts) before training")
    p.add_argument("--init-only", action="store_true", help="write the initial weights to "
                   "--save-init and train nothing (the other side can start from them while "
                   "this one trains)")
    p.add_argument("--no-validation", action="store_true")
    p.add_argument("--log-losses", action="store_true", help="also print every step's training "
                   "loss (the global batch's mean)")
    p.add_argument("--count-params", action="store_true",
                   help="print the model's trainable parameters as JSON and train nothing")
    a = p.parse_args()
    c = read_cfg(a.model)
    a.batch_size = a.batch_size or int(c["train"].get("batch_size", "32"))
    a.epochs = a.epochs or int(c["train"].get("epochs", "1"))
    if a.count_params:
        print(json.dumps({"model": a.model, "params": params(GPT(c))}), flush=True)
        sys.exit(0)
    if a.init_only:  # the weights a worker starts from (the same seed), written and no more
        if not a.save_init:
            p.error("--init-only writes --save-init FILE: name it")
        torch.manual_seed(a.seed)
        write_safetensors(a.save_init, hf_tensors(GPT(c)))
        sys.exit(0)
    if a.world < 1 or a.batch_size < a.world:
        p.error(f"--batch-size {a.batch_size} gives a rank of --world {a.world} no sequence")
    mp.spawn(worker, args=(a,), nprocs=a.world)
