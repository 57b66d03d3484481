"""RL: the algorithms as data, their pure math, one step's batch, the round loop, scoring, the critic,
the curriculum and the collapse warnings."""
