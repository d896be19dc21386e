import torch, time
from fl_lightning.settings import build_federation
torch.set_num_threads(1)
res = {}
for engine in ("per_client", "cohort"):
    fed = build_federation(["fit", "--config", "configs/fedavg_fmnist.yaml", "--data.idx_gz_dir", ".gpudata", "--optimizer.lr", "0.02",
        "--partition.num_clients", "100", "--federation.client_fraction", "0.02", "--federation.local_epochs", "1",
        "--federation.rounds", "1", "--federation.final_window", "1", "--trainer.engine", engine, "--trainer.workers", "1",
        "--run.logger", "none", "--run.progress", "false", "--run.dir", f"/tmp/ct/realeq_{engine}"], callbacks=[])[2]
    s = fed.fit(); res[engine] = ({k: v.clone() for k, v in fed.state.items()}, s["history"][0])
a, b = res["per_client"][0], res["cohort"][0]
print("maxdiff", max((a[k]-b[k]).abs().max().item() for k in a), "maxabs", max(a[k].abs().max().item() for k in a))
print({k: (res["per_client"][1][k], res["cohort"][1][k]) for k in ("train/loss", "test/accuracy", "train/steps")})
