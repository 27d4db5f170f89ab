"""hetsync: data-parallel training of PyTorch models on heterogeneous clusters.

ESync (local steps sized to the slowest worker's step, then averaged weight deltas) and the
schemes it is measured against, over torch.distributed.
"""

from hetsync._version import __version__


def wrap(optimizer, model, mode: str = "esync", **kwargs):
    """Wrap `optimizer` so that `step()` runs `mode` among the processes of torch.distributed's
    default group (started by torchrun), in the user's own training loop.

    Call it after `dist.init_process_group` and after building the model and optimizer; then
    train as before (`zero_grad`, `backward`, `step`), evaluate inside
    `opt.global_model()`, and call `opt.finish()` once every rank is done (an agreed stop:
    ranks whose data ran out take part contributing nothing until all are done).

    Args:
        optimizer: the local optimizer (`torch.optim.Optimizer`); a mode that cannot apply it
            refuses it in one line (ASGD's server applies plain SGD).
        model: the `torch.nn.Module` it optimizes; every rank starts from rank 0's.
        mode: any of `hetsync launch --help`'s modes but the PyTorch baselines (ddp,
            post-local-sgd): e.g. "esync", "esync-outer", "diloco", "sync", "async",
            "async-local-sgd", "fedbuff", "selsync", "eager-solo".
        collective: "native", "ring", "butterfly", "binary-blocks", "star" or "ps".
        group: the process group of the workers (default: all ranks, less the parameter
            server's where the mode has one).
        service: (host, port) of the service the mode declares (ESync's state server);
            default: rank 0 starts one.
        ps_rank: the parameter server's rank (default: the last); that rank calls
            `hetsync.serve_parameters` instead.
        timeout: seconds before a silent peer is taken as dead (default 120).
        slowdown: emulate a device this many times slower (default 1).
        batch_size: the batch of a step, exposed as `opt.batch_size` for the loader; with
            `profile` (`hetsync probe`'s file, device i = worker i), the fastest device's,
            each other's balanced to its speed (`opt.batch_size` then differs by rank, and
            every sum counts samples).
        run_dir / log_dir: where the run's records go (each worker writes its
            `worker-R.jsonl`; rank 0 `run.json` and `eval.jsonl`): a run directory, or a
            directory to make one in.
        **options: the mode's own options, named as its flags' long form with underscores
            (`-gl`/`--global-lr` is `global_lr=0.7`, `--inner-steps` is `inner_steps=8`);
            another mode's option is refused naming it.

    Returns a `hetsync.distributed_optimizer.DistributedOptimizer`: a `torch.optim.Optimizer`
    with `step()` (`step(loss=loss)` records the loss), `zero_grad()`, `param_groups`,
    `state_dict()`/`load_state_dict()` (the mode's state included), `global_model()`,
    `record_evaluation(accuracy, loss)`, `set_epoch(epoch)`, `finish()`, and `workers`,
    `rank` (this worker's place among them, for a sampler), `batch_size` (this worker's,
    for its loader), `run_dir`, `round` and `mode`.
    `help(hetsync.distributed_optimizer.DistributedOptimizer)` says what each does and
    lists every mode's options with their defaults. (The module is not called `wrap`:
    importing it would rebind this name.)"""
    from hetsync.distributed_optimizer import wrap as _wrap

    return _wrap(optimizer, model, mode, **kwargs)


def serve_parameters(optimizer, model, mode: str = "async", **kwargs) -> bool:
    """On the parameter server's rank of a mode that needs one: serve until every worker has
    finished, and return True; elsewhere return False at once. Call it before `wrap`, with
    the same arguments:

        if hetsync.serve_parameters(optimizer, model, mode="async"):
            return   # this process was the server
        opt = hetsync.wrap(optimizer, model, mode="async")

    Args: `optimizer` (its rate is the server's), `model` (the server starts from its
    weights), `mode`, and as `wrap`: `collective`, `ps_rank` (default: the last rank),
    `timeout`, `run_dir`/`log_dir` (the server writes `ps.jsonl`, its traffic, refusals and
    losses, into the run's directory) and the mode's `**options` (a server rule's, e.g.
    `dcasgd_lambda=0.04`, `buffer_size=2`)."""
    from hetsync.distributed_optimizer import serve_parameters as _serve

    return _serve(optimizer, model, mode, **kwargs)
