"""Training: the objective and its losses (losses.py), the step (loop.py), the Trainer (trainer.py), a run's
typed pieces (run.py) and the Trainer's side concerns (checkpoints.py, tracking.py, unseen_fit.py, warmup_hook.py),
a run's identity and exact resume and its state (resume.py), the warm-up from the bag of items (warmup.py), what
training hides from a model (regularisers.py) and the co-occurrence start of the article table (cooccurrence.py).

The public API is `__all__`: the names studies/ and users import from here (tests/test_studies.py). Those imported
below at module level come with the package; the others are exported lazily (`contextual_bert.lazy`).
"""

from typing import TYPE_CHECKING

from contextual_bert.lazy import lazy_exports
from contextual_bert.training.batches import BUCKET_BATCHES, length_batches
from contextual_bert.training.checkpoints import Checkpoints
from contextual_bert.training.loop import (
    CONVERGENCE_EPOCHS,
    CONVERGENCE_NATS,
    convergence,
    even_sample,
    lr_factor,
    make_optimizer,
    train_step,
    validation_cross_entropy,
)
from contextual_bert.training.losses import (
    LOSS_CHUNK_ROWS,
    LinearCrossEntropy,
    NegativeSampler,
    fused_loss_applies,
    mask_items,
    masked_item_loss,
    negative_sampler,
    sampled_cross_entropy,
    sampled_item_loss,
)
from contextual_bert.training.regularisers import drop_history, id_dropout_rate
from contextual_bert.training.resume import (
    CURVE_FILE,
    RESUMABLE_CHANGES,
    Position,
    RunState,
    code_digest,
    load_resume_state,
    pin_threads_and_algorithms,
    random_states,
    restore_random_states,
    run_key,
    save_resume_state,
    seeded_random_states,
)
from contextual_bert.training.run import Optimisation, Run, RunData, RunSetup
from contextual_bert.training.tracking import EpochHook, Tracking
from contextual_bert.training.trainer import Trainer, fit, model_and_splits, not_applicable, start, train
from contextual_bert.training.unseen_fit import UnseenOffset
from contextual_bert.training.warmup import BagWarmup, bag_warmup_weight, reads_bag_warmup, set_bag_weight, stuck_check
from contextual_bert.training.warmup_hook import BagWarmupHook

if TYPE_CHECKING:
    from contextual_bert.training.cooccurrence import init_from_cooccurrence
    from contextual_bert.training.loop import step_loss
    from contextual_bert.training.unseen_fit import best_delta, fit_unseen_offset

_PUBLIC = {  # a lazily exported name: its module in this package
    "init_from_cooccurrence": "cooccurrence",
    "step_loss": "loop",
    "best_delta": "unseen_fit",
    "fit_unseen_offset": "unseen_fit",
}
__all__ = [
    "BUCKET_BATCHES",
    "length_batches",
    "Checkpoints",
    "CONVERGENCE_EPOCHS",
    "CONVERGENCE_NATS",
    "convergence",
    "even_sample",
    "lr_factor",
    "make_optimizer",
    "train_step",
    "validation_cross_entropy",
    "LOSS_CHUNK_ROWS",
    "LinearCrossEntropy",
    "NegativeSampler",
    "fused_loss_applies",
    "mask_items",
    "masked_item_loss",
    "negative_sampler",
    "sampled_cross_entropy",
    "sampled_item_loss",
    "drop_history",
    "id_dropout_rate",
    "CURVE_FILE",
    "RESUMABLE_CHANGES",
    "Position",
    "RunState",
    "code_digest",
    "load_resume_state",
    "pin_threads_and_algorithms",
    "random_states",
    "restore_random_states",
    "run_key",
    "save_resume_state",
    "seeded_random_states",
    "Optimisation",
    "Run",
    "RunData",
    "RunSetup",
    "EpochHook",
    "Tracking",
    "Trainer",
    "fit",
    "model_and_splits",
    "not_applicable",
    "start",
    "train",
    "UnseenOffset",
    "BagWarmup",
    "bag_warmup_weight",
    "reads_bag_warmup",
    "set_bag_weight",
    "stuck_check",
    "BagWarmupHook",
    *_PUBLIC,
]

__getattr__ = lazy_exports(__name__, _PUBLIC, globals())
