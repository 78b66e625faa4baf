"""The two ways a screen can fail that are the user's to fix, each with its own exit code."""


class InputError(Exception):
    """Bad input: a config field, a file, a flag. One sentence naming what is wrong (exit 2)."""

    exit_code = 2


class UnassessableError(Exception):
    """The model ran but its spectra carry no signal, e.g. every block is the identity (exit 3)."""

    exit_code = 3
