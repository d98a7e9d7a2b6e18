"""MLM + NSP pretraining data: instance creation, compact storage, parallel builder, streaming loader.

Public entry points, imported from their modules (the package exports nothing, so that an import names
the module it loads, as the stages' code deps need):

* :class:`~bert_core.pretrain_data.params.PretrainDataParams` — the stage's typed params;
* :func:`~bert_core.pretrain_data.build.build_pretrain_data` — build ``<out>/<phase>/{train,heldout}``;
* :class:`~bert_core.pretrain_data.loader.PretrainingLoader` — shuffled, DDP-split, resumable batches;
* :func:`~bert_core.pretrain_data.loader.check_vocab_size` — refuse a model/data vocabulary mismatch.

Modules: :mod:`.instances` (pairs, truncation), :mod:`.masking` (MLM, whole-word, dynamic),
:mod:`.storage` (on-disk format), :mod:`.plan` / :mod:`.worker` / :mod:`.build` (parallel streaming builder),
:mod:`.partial` (finished tasks kept across a crash), :mod:`.loader`, :mod:`.checks` (Great Expectations),
:mod:`.testing` (corpora for tests). The vocabulary is read with :mod:`bert_core.vocab.info`.

Faithful to Google's ``create_pretraining_data.py`` (pair creation, per-document short target, put-back
of unused sentences, front/back truncation of the longer segment, ``num_to_predict``, 80/10/10 (the
default of ``mask_split``), whole-word masking with skip-on-overshoot and a per-token split), with these
deliberate deviations:

1. Streaming: NotNext B comes from another document of the same *window* (documents of the same task held
   in memory, at least two), not from the whole corpus; B is never from A's document (Google accepts
   the same document after 10 failed draws).
2. ``nsp_balance`` (default on): single-sentence chunks are forced to NotNext, which lifts Google's NotNext
   share above 50% (53.4% at seq128, 54.8% at seq512 on the default corpus); balancing leans the coin of
   multi-sentence chunks against the running imbalance (carried over a task's windows and passes) so the share is ``random_next_prob`` within a
   fraction of a point (50.0% on the same corpus).
3. ``num_to_predict`` counts the maskable positions (Google multiplies the full length including
   [CLS]/[SEP]); literal special tokens in text, [UNK] included, are never masked (Hugging Face's rule);
   a ``##`` piece right after [SEP] starts a new word for whole-word masking.
4. Output order: instances are written per task/window/pass, not globally shuffled; the loader shuffles
   globally each epoch (Feistel permutation), which Google's single final shuffle cannot do per epoch.
5. The held-out split is always built with static masks (``heldout_dupe_factor`` passes, default 1) so
   evaluation is fixed; ``masking: dynamic`` applies to train only.
"""
