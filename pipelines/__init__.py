"""Dagster definitions, jobs, the retraining sensor, resources per profile, and `make run`."""
