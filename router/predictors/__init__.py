"""Predictors the policies consume; ``base`` defines their interfaces and static priors."""
