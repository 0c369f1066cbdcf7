"""The gpt example's architecture in PyTorch, the reference for its speed.

A GPT-2-style character-level model exactly as examples/gpt builds it:
a byte embedding (256) and learned positions, DEPTH pre-norm blocks
(LayerNorm, a [Q|K|V] Linear, causal multi-head attention, an output
Linear; LayerNorm, Linear to 4·WIDTH, GELU in its tanh form, Linear back),
a final LayerNorm and a Linear head to 256 logits, softmax cross-entropy
averaged over every position. Trained with Adam on windows of CONTEXT+1
bytes of the Go standard library's source, BATCH windows a step, one
thread (torch.set_num_threads(1); OPENBLAS_NUM_THREADS=1 is set by the
caller). Prints one JSON line: the median samples (windows) per second of
the steps after the first WARMUP.

  OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/gpt_torch.py  # env: WIDTH DEPTH HEADS CONTEXT BATCH STEPS WARMUP
"""
import glob
import json
import math
import os
import statistics
import subprocess
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

WIDTH = int(os.environ.get("WIDTH", 256))
DEPTH = int(os.environ.get("DEPTH", 4))
HEADS = int(os.environ.get("HEADS", 4))
CONTEXT = int(os.environ.get("CONTEXT", 128))
BATCH = int(os.environ.get("BATCH", 8))
STEPS = int(os.environ.get("STEPS", 40))
WARMUP = int(os.environ.get("WARMUP", 5))
torch.set_num_threads(1)
torch.manual_seed(1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.fc1, self.fc2 = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)
        mask = torch.triu(torch.ones(CONTEXT, CONTEXT, dtype=torch.bool), diagonal=1)
        self.register_buffer("mask", mask)

    def attention(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split(WIDTH, dim=2)
        dh = WIDTH // HEADS
        q, k, v = (z.view(b, t, HEADS, dh).transpose(1, 2) for z in (q, k, v))
        s = (q @ k.transpose(-2, -1)) / math.sqrt(dh)
        s = s.masked_fill(self.mask[:t, :t], float("-inf"))
        y = F.softmax(s, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, WIDTH))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(256, WIDTH)
        self.pos = nn.Parameter(0.02 * torch.randn(CONTEXT, WIDTH))
        self.blocks = nn.ModuleList(Block() for _ in range(DEPTH))
        self.lnf, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 256)

    def forward(self, ids):
        x = self.tok(ids) + self.pos[: ids.shape[1]]
        for b in self.blocks:
            x = b(x)
        return self.head(self.lnf(x))


def corpus(limit=8 << 20):
    root = subprocess.run(["go", "env", "GOROOT"], capture_output=True, text=True).stdout.strip()
    data = bytearray()
    for path in sorted(glob.glob(os.path.join(root, "src", "**", "*.go"), recursive=True)):
        if "/testdata/" in path:
            continue
        with open(path, "rb") as f:
            data += f.read()
        if len(data) >= limit:
            break
    return torch.tensor(list(data), dtype=torch.long)


text = corpus()
windows = (len(text) - 1) // CONTEXT
model = GPT()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(2)
times = []
for step in range(STEPS):
    idx = torch.randint(0, windows, (BATCH,), generator=g)
    batch = torch.stack([text[i * CONTEXT : i * CONTEXT + CONTEXT + 1] for i in idx.tolist()])
    start = time.perf_counter()
    logits = model(batch[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    times.append(time.perf_counter() - start)
rate = BATCH / statistics.median(times[WARMUP:])
print(json.dumps(dict(impl="pytorch", torch=torch.__version__, width=WIDTH, depth=DEPTH, heads=HEADS, context=CONTEXT,
                      batch=BATCH, samples_per_s=rate, loss=float(loss))))
