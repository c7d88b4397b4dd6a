"""Before RL: the supervised warm start on a domain's demonstrations and the calibration of the
policy RL starts from."""
