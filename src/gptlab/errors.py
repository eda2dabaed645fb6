"""The one exception type of gptlab.

Every error that bad input can cause is a ``GptlabError`` whose message says what
is wrong and, where it can, what to change. The CLI prints it as one line,
``error: <message>``, and exits with status 2. Any other exception is a bug.
"""


class GptlabError(Exception):
    """Bad input, a bad file or an impossible request: a message for a person."""
