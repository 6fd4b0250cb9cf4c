"""Faults placed inside Ray actors: `ray.get(actor.__ray_call__.remote(hook, *args))` runs a hook in the
actor's process with the actor instance as its first argument. Processes die by SIGKILL, exactly where
the hook says; NaNs replace real values once. Pickled by value, since workers cannot import the test folders."""

from __future__ import annotations

import os
import signal
import sys

import ray

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def die_on_explore_call(explorer, call: int) -> None:
    """SIGKILL this explorer process while it runs its `call`-th explore task (1-based, from now)."""
    seen = {"n": 0}
    sync = explorer.sync

    def dying_sync(version, *args, **kwargs):
        seen["n"] += 1
        if seen["n"] == call:
            os.kill(os.getpid(), signal.SIGKILL)
        return sync(version, *args, **kwargs)

    explorer.sync = dying_sync


def die_in_update(learner) -> None:
    """SIGKILL the learner in the middle of its next update (its first loss evaluation)."""
    import learner.updates as updates_module

    loss_fn = updates_module.nft_loss

    def dying_loss(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)
        return loss_fn(*args, **kwargs)

    updates_module.nft_loss = dying_loss


def die_writing_checkpoint(learner, checkpoint: int) -> None:
    """SIGKILL the learner half way through writing its `checkpoint`-th checkpoint from now."""
    import learner.checkpoint as checkpoint_module

    write, seen = checkpoint_module.write_safetensors, {"files": 0}
    files_per_checkpoint = len(checkpoint_module.FILES) + (learner.trainer.state.ema is not None)

    def dying_write(*args, **kwargs):
        seen["files"] += 1
        if seen["files"] == (checkpoint - 1) * files_per_checkpoint + 2:  # theta written, old not yet
            os.kill(os.getpid(), signal.SIGKILL)
        return write(*args, **kwargs)

    checkpoint_module.write_safetensors = dying_write


def nan_reward_once(learner) -> None:
    """The next regeneration scores one sample NaN."""

    class NaNOnce:
        def __init__(self, inner):
            self.inner, self.armed = inner, True

        def score_and_details(self, images, prompts, metadata=None):
            rewards, details = self.inner.score_and_details(images, prompts, metadata)
            if self.armed:
                self.armed = False
                rewards = rewards.clone()
                rewards[0] = float("nan")
            return rewards, details

    rollouts = learner.trainer.rollouts  # the part that scores regenerated samples
    rollouts.reward = NaNOnce(rollouts.reward)


def nan_loss_for_one_update(learner) -> None:
    """Every loss of the next update is NaN: each micro-batch is dropped, so the update is skipped."""
    import learner.updates as updates_module

    loss_fn, iteration = updates_module.nft_loss, learner.trainer.iteration

    def nan_loss(*args, **kwargs):
        loss = loss_fn(*args, **kwargs)
        return loss * float("nan") if learner.trainer.iteration == iteration else loss

    updates_module.nft_loss = nan_loss


def die_scoring_once(scorer) -> None:
    """SIGKILL this scorer process in the middle of its next batch (after the first reward has scored)."""
    name = list(scorer.rewards)[-1]
    reward = scorer.rewards[name]

    def dying(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)
        return reward.score_and_details(*args, **kwargs)

    reward.score_and_details = dying


def delay_explore(explorer, seconds: float) -> None:
    """This explorer answers each explore call `seconds` late (its group arrives after the others)."""
    import time

    sync = explorer.sync  # Ray looks actor methods up on the class: wrap what `explore` calls first

    def late(*args, **kwargs):
        time.sleep(seconds)
        return sync(*args, **kwargs)

    explorer.sync = late
