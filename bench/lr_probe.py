"""Does plain PyTorch also collapse when the stack's C1 ResNet-50 personalises at lr 3e-4?

    .venv/bin/python bench/lr_probe.py    # after bench/stack.py has pretrained and exported C1

The stack bench's personalisation (6 AdamW steps of 32 windows, frozen BatchNorm, lr 3e-4)
took ResNet-50 on held-out user 8 from 0.867 to 0.407 on the device runtime. This runs the
same recipe in torch eager from the same cached population model on the same user's
windows, at lr 3e-4 and 3e-5, and prints accuracy before -> after and the six losses. Not a
benchmark table: a diagnosis, kept so the figures in docs/results.md can be reproduced.
"""
import json, sys, time
import numpy as np, torch
sys.path.insert(0, "bench")
from stack_config import STACK, pretrain_config
from exporters.models.pretrain import pretrain
from edgetrain.userdata import user_data
from edgetrain import data

art = json.load(open(f"bench/results/stack/export-{STACK[0].key()}.json"))["artifact"]  # C1
(xtr, ytr), (xte, yte) = user_data(art, 8, None)
base, s = pretrain(pretrain_config("resnet50", False), show_progress=False)
mean, scale = s["channel_mean"], s["channel_scale"]
def imgs(x):
    sig = data.standardised_signals(x, mean, scale, 224)
    return torch.from_numpy(np.stack([data.gasf_region(q, slice(0, 224), slice(0, 224)) for q in sig]).astype(np.float32))
print("shapes", xtr.shape, xte.shape, flush=True)
Xtr, Xte = imgs(xtr), imgs(xte)
Ytr, Yte = torch.from_numpy(np.asarray(ytr, np.int64)), torch.from_numpy(np.asarray(yte, np.int64))
def acc(m):
    m.eval()
    with torch.no_grad():
        return float((torch.cat([m(Xte[i:i+16]).argmax(1) for i in range(0, len(Xte), 16)]) == Yte).float().mean())
state = {k: v.clone() for k, v in base.state_dict().items()}
for lr in (3e-4, 3e-5):
    base.load_state_dict(state)
    before = acc(base)
    opt = torch.optim.AdamW(base.parameters(), lr=lr, weight_decay=0.0, eps=1e-6)
    rng = np.random.default_rng(0)
    t = time.time(); losses = []
    for epoch in range(2):
        order = rng.permutation(len(Xtr))
        for st in range(len(Xtr) // 32):
            idx = torch.from_numpy(order[st*32:(st+1)*32])
            base.train()
            for m in base.modules():
                if isinstance(m, torch.nn.BatchNorm2d): m.eval()
            loss = torch.nn.functional.cross_entropy(base(Xtr[idx]), Ytr[idx])
            opt.zero_grad(); loss.backward(); opt.step(); losses.append(round(loss.item(), 3))
    print(f"lr {lr:g}: accuracy {before:.3f} -> {acc(base):.3f}; losses {losses}; {time.time()-t:.0f}s", flush=True)
