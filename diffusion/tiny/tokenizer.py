"""Word-level tokenizers built in memory: stand-ins for CLIP's, T5's, Gemma's and Qwen2's in tiny real pipelines.

A hub tokenizer cannot be downloaded here (and `from_pretrained` offline can silently return a 2-token
one), so tiny pipelines use a `tokenizers` WordLevel model wrapped in `PreTrainedTokenizerFast`: it
saves as `tokenizer.json` and loads back with `from_pretrained` like any fast tokenizer. Unknown words
map to `<unk>`, so any prompt tokenizes.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<unk>", "<bos>", "<eos>")
# The words of the tests' prompts; any other word is <unk>.
WORDS = (
    "a", "an", "the", "of", "and", "photo", "drawing", "painting", "handwritten", "digit", "cat", "dog", "red",
    "blue", "green", "sign", "that", "says", "on", "in", "with", "zero", "one", "two", "three", "four", "five",
    "six", "seven", "eight", "nine",
)


def word_tokenizer(max_length: int, words: Iterable[str] = WORDS, *, bos: bool = True) -> PreTrainedTokenizerFast:
    """Lower-cased whitespace word tokenizer with `<pad> <unk> <bos> <eos>`; `bos=False` appends only
    `<eos>` (as T5 does)."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + tuple(sorted(set(words))))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    single = "<bos> $A <eos>" if bos else "$A <eos>"
    core.post_processor = processors.TemplateProcessing(
        single=single, special_tokens=[("<bos>", vocab["<bos>"]), ("<eos>", vocab["<eos>"])]
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", eos_token="<eos>",
                                        pad_token="<pad>", unk_token="<unk>", model_max_length=max_length)
    if len(tokenizer) != len(vocab):
        raise AssertionError(f"tokenizer has {len(tokenizer)} tokens, expected {len(vocab)}")
    return tokenizer


# Qwen2's chat markers; `<|endoftext|>` is its padding token.
CHAT_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def chat_tokenizer(max_length: int, words: Iterable[str] = WORDS) -> PreTrainedTokenizerFast:
    """A word-level stand-in for Qwen2's tokenizer in a chat template: Qwen2's special tokens and the
    newline are tokens of their own (matched before the words), every word and punctuation run is one
    token, and nothing is added around a text (Qwen2 adds no BOS/EOS). Qwen2's BPE splits
    `QwenImagePipeline`'s system prompt into one token per word too, so the template's first 34 tokens —
    the ones the pipeline drops — are the same span here as with the real tokenizer."""
    template = ["system", "user", "assistant", "describe", "the", "image", "by", "detailing", "color", "shape", "size",
                "texture", "quantity", "text", "spatial", "relationships", "of", "objects", "and", "background"]
    vocab_words = sorted(set(words) | set(template) | {",", ":"})
    vocab = {tok: i for i, tok in enumerate((*CHAT_SPECIAL_TOKENS, "\n", "<unk>", *vocab_words))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.add_special_tokens(list(CHAT_SPECIAL_TOKENS))
    core.add_tokens([AddedToken("\n", normalized=False)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        unk_token="<unk>", model_max_length=max_length)
    if len(tokenizer) != len(vocab):
        raise AssertionError(f"tokenizer has {len(tokenizer)} tokens, expected {len(vocab)}")
    return tokenizer
