"""The built-in template proposer: parameterised kernels whose moves are transformations.

Each family (families/*.py) recognises the cards it can serve, names the parameter axes that
make sense for the card's shape (block size, rows per block, vector width, passes, ...), and
renders a complete candidate for the cuda or the cpu backend. The proposer walks that space
from a heuristic first point, one transformation per child.
"""
