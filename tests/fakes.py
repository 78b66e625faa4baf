"""Stand-ins shared by the tests."""

from rksp_cli.monitors.base import Alert


class AlarmsAt:
    """Stands in for a Monitor: an alarm on the given steps, whatever the model does."""

    names, seconds = ["fake"], {"fake": 0.0}

    def __init__(self, steps, every: int = 5):
        self.steps, self.every = set(steps), every
        self.restores = 0  # how often a guard said it set the weights back

    def restored(self):
        self.restores += 1

    def step(self, step, loss=None):
        return [Alert(step, "fake", None, 1.0, 0.5, "alarm", "test")] if step in self.steps else []

    def remove(self):
        """No hooks to detach."""
