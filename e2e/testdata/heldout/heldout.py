"""A user's script as gpujob does not know it: init_method="env://", the
`if __name__ == "__main__":` guard, sys.argv, a relative import from its own
directory and DataLoader workers (num_workers = 2). It prints one result line
that must be the same whether the ranks start cold or from a preloaded
interpreter; only `preloaded` (was torch imported before this script's first
line?) tells the two apart."""
import sys

PRELOADED = "torch" in sys.modules

import json  # noqa: E402
import os  # noqa: E402

import heldout_helper  # noqa: E402  (this script's own directory)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402


def main(argv):
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    factor = heldout_helper.parse_factor(argv[1])
    torch.manual_seed(1234 + rank)
    data = TensorDataset(torch.randn(96, 4))
    loader = DataLoader(data, batch_size=8, num_workers=2, shuffle=False)
    total = torch.zeros(1, dtype=torch.float64)
    for (x,) in loader:
        total += x.double().sum() * factor
    info = torch.utils.data.get_worker_info()  # None here: the loading ran in the workers
    total_all = total.clone()
    dist.all_reduce(total_all)
    if rank == 0:
        result = {
            "name": __name__,
            "argv": argv[1:],
            "helper": heldout_helper.__name__,
            "world": world,
            "total": round(total_all.item(), 9),
            "cwd_is_task_dir": os.getcwd().endswith("/train"),
            "in_main_worker_info": info is None,
            "preloaded": PRELOADED,
        }
        print("gpujob-result: " + json.dumps(result, sort_keys=True), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
