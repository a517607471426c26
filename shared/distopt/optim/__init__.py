"""Optimizers and what keeps them stable at scale.

``schedules`` (linear scaling, warm-up + cosine), ``optimizers`` (LARS, LAMB), ``recipe``
(the training project's AdamW groups, cosine and WSD schedules), ``stability`` (spike
monitor, checkpoint and rollback).
"""
