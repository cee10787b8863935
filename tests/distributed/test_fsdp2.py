"""FSDP2 (`fully_shard`) on CPU with gloo, 2 and 4 ranks: weights and gradients are
DTensor shards; the saved reductions are those of the whole tensors, combined from the
shards without gathering, equal to numpy on the gathered tensors and to the same model
trained unsharded on the same data; the raw shards reassemble into the whole tensor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.heavy


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world_size", [2, 4])
def test_fsdp2_reductions_are_those_of_the_whole_tensors(tmp_path, monkeypatch, world_size):
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch.distributed.fsdp")
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    import fsdp_ranks

    import stepscope
    from stepscope import reductions
    from stepscope.modes import ModeKeys

    out = str(tmp_path / "job")
    torch.multiprocessing.spawn(fsdp_ranks.train_rank, args=(world_size, str(tmp_path / "init"), out, str(tmp_path / "seen")), nprocs=world_size, join=True)
    seen = torch.load(str(tmp_path / "seen"))

    # The same model, unsharded, on every rank's batch at once (FSDP averages the ranks'
    # gradients: the gradient of the mean loss over the combined batch).
    reference = fsdp_ranks.make_model()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    unsharded = []
    for step in range(fsdp_ranks.STEPS):
        weights = {n: p.detach().clone() for n, p in reference.named_parameters()}
        x, y = (torch.cat(parts) for parts in zip(*(fsdp_ranks.batch(r, step) for r in range(world_size))))
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(reference(x), y).backward()
        unsharded.append({"weights": weights, "grads": {n: p.grad.clone() for n, p in reference.named_parameters()}})
        optimizer.step()

    trial = stepscope.create_trial(out)
    workers = [f"worker_{r}" for r in range(world_size)]
    assert trial.workers() == workers and trial.steps(mode=ModeKeys.TRAIN) == list(range(fsdp_ranks.STEPS))
    for step in range(fsdp_ranks.STEPS):
        for kind, prefix in (("weights", ""), ("grads", "gradient/")):
            for param, whole in seen[kind][step].items():
                name = prefix + param
                gathered = whole.detach().numpy()
                # Raw values: each worker's shard; in offset order they are the tensor.
                shards = []
                for worker in workers:
                    dim, offset, length, size = trial.tensor(f"stepscope/shard/{name}").value(step, worker=worker)
                    assert dim == 0 and size == gathered.shape[0]
                    shards.append((int(offset), trial.tensor(name).value(step, worker=worker)))
                np.testing.assert_array_equal(np.concatenate([s for _, s in sorted(shards, key=lambda s: s[0])]), gathered)
                for worker in workers:  # saved, not computed from the shard by the reader
                    assert len(trial.tensor(name).reduction_values(step, worker=worker)) == 9
                for reduction in fsdp_ranks.REDUCTIONS + fsdp_ranks.NORMS:
                    expected = float(reductions.compute(gathered, reduction))
                    other = float(reductions.compute(unsharded[step][kind][param].numpy(), reduction))
                    for worker in workers:  # every worker saved the combined value
                        saved = float(trial.tensor(name).reduction_value(step, reduction, worker=worker))
                        assert saved == pytest.approx(expected, rel=1e-9, abs=1e-12), (name, reduction, worker)
                    if reduction in ("l1", "l2", "std", "variance", "max", "min"):
                        assert saved == pytest.approx(other, rel=1e-5, abs=1e-7), (name, reduction, "unsharded")
                assert float(trial.tensor(name).reduction_value(step, "max", abs=True)) == pytest.approx(np.abs(gathered).max())
                if kind == "grads":
                    assert float(trial.tensor(name).reduction_value(step, "l2")) == pytest.approx(float(np.linalg.norm(unsharded[step]["grads"][param].numpy())), rel=1e-6)
