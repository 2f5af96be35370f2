"""The package's private core, below every method: the input type built at each public entry, argument checks and
their messages, the head-type rule, logits or probabilities, finiteness, threads, progress bars, checkpoint files
and the version. It imports no other part of the package."""
