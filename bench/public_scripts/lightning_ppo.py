"""Mirrors Lightning-AI/pytorch-lightning `examples/pytorch/domain_templates/reinforce_learn_ppo.py`:
PPO with manual optimization, a categorical actor and a critic (each an MLP
Linear-ReLU-Linear-ReLU-Linear), two Adam optimizers (actor lr 3e-4, critic lr 1e-3)
returned by `configure_optimizers`, trajectories collected each epoch by an iterable
dataset, discounted returns (gamma 0.99) and GAE advantages (lambda 0.95), normalised
advantages, the clipped surrogate loss (clip ratio 0.2) and a squared-error value loss,
each `training_step` stepping the actor, then the critic. Scaled for CPU seconds: hidden
width 64 instead of 128, 512 environment steps per epoch instead of 2048, batch 32 instead
of 512, 13 epochs (208 batches); the gym environment is replaced by a small one written here (4
observations, 2 actions, reward 1 when the action matches which of the first two
observations is larger; 50-step episodes), which a policy can learn.

Faults: `exploding_one_network` (the critic's lr 10, 1e4 times the script's), `lr_zero`."""

from __future__ import annotations

from pathlib import Path

from .capture import lightning_callback


class _MatchEnv:
    """4 random observations; reward 1 when the action is 1 exactly when obs[0] > obs[1]."""

    def __init__(self, seed: int):
        import numpy as np

        self.rng = np.random.default_rng(seed)
        self.t = 0
        self.state = self.rng.standard_normal(4).astype("float32")

    def reset(self):
        self.t = 0
        self.state = self.rng.standard_normal(4).astype("float32")
        return self.state

    def step(self, action: int):
        reward = float(action == int(self.state[0] > self.state[1]))
        self.t += 1
        self.state = self.rng.standard_normal(4).astype("float32")
        return self.state, reward, self.t >= 50


def train(out_dir: Path, config: str, fault: str | None = None) -> None:
    import lightning.pytorch as pl
    import torch
    import torch.nn as nn
    from torch.distributions import Categorical

    torch.set_num_threads(1)
    pl.seed_everything(42, verbose=False)

    def create_mlp(n_in: int, n_out: int, hidden: int = 64):
        return nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, n_out))

    class Experience(torch.utils.data.IterableDataset):
        def __init__(self, generate):
            self.generate = generate

        def __iter__(self):
            return self.generate()

    class PPO(pl.LightningModule):
        def __init__(self, lr_actor=3e-4, lr_critic=1e-3, gamma=0.99, lam=0.95, clip_ratio=0.2, batch_size=32, steps_per_epoch=512):
            super().__init__()
            self.save_hyperparameters()
            self.automatic_optimization = False
            self.env = _MatchEnv(seed=0)
            self.actor = create_mlp(4, 2)
            self.critic = create_mlp(4, 1)
            self.state = torch.from_numpy(self.env.reset())

        def forward(self, x):
            pi = Categorical(logits=self.actor(x))
            return pi, pi.sample(), self.critic(x)

        def discount(self, rewards, factor):
            out, running = [], 0.0
            for r in reversed(rewards):
                running = r + factor * running
                out.append(running)
            return list(reversed(out))

        def generate(self):
            hp = self.hparams
            states, actions, logps, qvals, advs = [], [], [], [], []
            rewards, values = [], []
            for step in range(hp.steps_per_epoch):
                with torch.no_grad():
                    pi, action, value = self(self.state)
                    logp = pi.log_prob(action)
                next_state, reward, done = self.env.step(int(action))
                states.append(self.state)
                actions.append(action)
                logps.append(logp)
                rewards.append(reward)
                values.append(float(value))
                self.state = torch.from_numpy(next_state)
                if done or step == hp.steps_per_epoch - 1:
                    last = 0.0 if done else float(self.critic(self.state))
                    qvals += self.discount(rewards + [last], hp.gamma)[:-1]
                    deltas = [r + hp.gamma * v1 - v0 for r, v0, v1 in zip(rewards, values, values[1:] + [last])]
                    advs += self.discount(deltas, hp.gamma * hp.lam)
                    rewards, values = [], []
                    if done:
                        self.state = torch.from_numpy(self.env.reset())
            yield from zip(states, actions, logps, torch.tensor(qvals), torch.tensor(advs))

        def training_step(self, batch):
            state, action, logp_old, qval, adv = batch
            adv = (adv - adv.mean()) / adv.std()
            optimizer_actor, optimizer_critic = self.optimizers()
            pi = Categorical(logits=self.actor(state))
            ratio = torch.exp(pi.log_prob(action) - logp_old)
            loss_actor = -torch.min(ratio * adv, torch.clamp(ratio, 1 - self.hparams.clip_ratio, 1 + self.hparams.clip_ratio) * adv).mean()
            self.manual_backward(loss_actor)
            optimizer_actor.step()
            optimizer_actor.zero_grad()
            loss_critic = (qval - self.critic(state).squeeze(-1)).pow(2).mean()
            self.manual_backward(loss_critic)
            optimizer_critic.step()
            optimizer_critic.zero_grad()
            self.log_dict({"loss_actor": loss_actor, "loss_critic": loss_critic})

        def configure_optimizers(self):
            return (torch.optim.Adam(self.actor.parameters(), lr=self.hparams.lr_actor),
                    torch.optim.Adam(self.critic.parameters(), lr=self.hparams.lr_critic))

        def train_dataloader(self):
            return torch.utils.data.DataLoader(Experience(self.generate), batch_size=self.hparams.batch_size)

    lrs = {"exploding_one_network": {"lr_critic": 10.0}, "lr_zero": {"lr_actor": 0.0, "lr_critic": 0.0}}.get(fault or "", {})
    callback = lightning_callback(out_dir, config)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=13, callbacks=[callback], default_root_dir=str(Path(out_dir) / "lightning"),
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(PPO(**lrs))
    callback.close()
