"""Task heads other than the causal-LM head: sequence / token classifiers (their logits and loss tensors)."""

from fitcheck.core.heads.classifier import CLASSIFIER_TASKS, classifier_head_backward, classifier_logits

__all__ = ["CLASSIFIER_TASKS", "classifier_head_backward", "classifier_logits"]
