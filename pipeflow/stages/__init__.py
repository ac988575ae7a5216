"""Pipeline stages: one module per stage. See :class:`pipeflow.stages.base.Stage` for the contract."""
