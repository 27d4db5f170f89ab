"""Fashion-MNIST with a model and loop of your own, data-parallel with hetsync: the twin of
mnist_ddp.py, from which it differs in the few lines docs/own-loop.md shows. Every mode works,
parameter-server ones included (the last rank serves), with nothing started by hand:

    torchrun --standalone --nproc-per-node 3 examples/mnist_hetsync.py --mode esync
    hetsync summarize runs/esync-net-* && hetsync plot runs/esync-net-* -o figures
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import hetsync
from hetsync.data import load_dataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1)
        self.conv2 = nn.Conv2d(16, 32, 3, 1)
        self.dropout = nn.Dropout(0.25)
        self.fc1 = nn.Linear(4608, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = F.relu(self.fc1(torch.flatten(self.dropout(x), 1)))
        return self.fc2(x)


def train(args, model, loader, optimizer, scheduler, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(loader):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        scheduler.step()
        if batch_idx % args.log_interval == 0 and dist.get_rank() == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(loader.sampler)}]"
                  f"\tLoss: {loss.item():.6f}", flush=True)


def test(model, loader) -> float:
    model.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for data, target in loader:
            output = model(data)
            loss += F.cross_entropy(output, target, reduction="sum").item()
            correct += (output.argmax(1) == target).sum().item()
    n = len(loader.dataset)
    print(f"Test set: Average loss: {loss / n:.4f}, Accuracy: {correct}/{n} "
          f"({100.0 * correct / n:.2f}%)", flush=True)
    return correct / n


def main():
    parser = argparse.ArgumentParser(description="Fashion-MNIST, data-parallel")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--subset", type=int, default=None, help="train on the first N images")
    parser.add_argument("--log-interval", type=int, default=50)
    parser.add_argument("--mode", default="esync")
    args = parser.parse_args()
    torch.manual_seed(1)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    data = load_dataset("fashion-mnist")
    n = len(data.train) if args.subset is None else args.subset
    train_set = TensorDataset(*data.train.batch(torch.arange(n)))
    test_set = TensorDataset(*data.test.batch(torch.arange(len(data.test))))
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    if hetsync.serve_parameters(optimizer, model, mode=args.mode, log_dir="runs"):
        return dist.destroy_process_group()  # this rank was the parameter server
    optimizer = hetsync.wrap(optimizer, model, mode=args.mode, log_dir="runs")
    sampler = DistributedSampler(train_set, optimizer.workers, optimizer.rank)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    scheduler = StepLR(optimizer, step_size=len(loader), gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        train(args, model, loader, optimizer, scheduler, epoch)
    optimizer.finish()  # every worker ends here together, with the global model
    if dist.get_rank() == 0:
        optimizer.record_evaluation(test(model, DataLoader(test_set, batch_size=1000)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
