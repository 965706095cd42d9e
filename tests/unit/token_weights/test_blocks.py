"""Text blocks and the token → block map shared by blockwise_adv and rs_grpo (trl_groupx/token_weights/blocks.py)."""

import math

import pytest
import torch

from trl_groupx.token_weights.blocks import (
    block_char_spans,
    block_tags_field,
    check_block_tags,
    spread_block_advantages,
    token_block_ids,
)

INF = math.inf
TAGS = ["answer", "confidence"]


class PieceTokenizer:
    """Token id `i` decodes to `pieces[i]`: multi-character tokens, to test tokens that straddle a boundary."""

    def __init__(self, pieces):
        self.pieces = pieces

    def batch_decode(self, sequences, **kwargs):
        return ["".join(self.pieces[i] for i in seq) for seq in sequences]


def test_spans_of_a_complete_completion():
    text = "think<answer>4</answer> <confidence>0.9</confidence>!"
    # block 0: [0, end of "</answer>") = [0, 23); block 1: [23, end of "</confidence>") = [23, 52); "!" outside
    assert text.index("</answer>") + len("</answer>") == 23 and len(text) == 53
    assert block_char_spans(text, TAGS) == [(0, 23), (23, 52)]


def test_unclosed_and_missing_tags():
    # truncated inside the confidence block: the last block runs to the end
    assert block_char_spans("<answer>4</answer><confidence>0.", TAGS) == [(0, 18), (18, INF)]
    # no </answer>: block 0 ends where <confidence> opens (index 9 = len("<answer>4")); block 1 ends after
    # "</confidence>" at 9 + 12 ("<confidence>") + 1 ("1") + 13 ("</confidence>") = 35
    assert block_char_spans("<answer>4<confidence>1</confidence>", TAGS) == [(0, 9), (9, 35)]
    # no tags at all: everything is block 0, block 1 is empty
    assert block_char_spans("just text", TAGS) == [(0, INF), (INF, INF)]


def test_token_block_ids_with_the_tiny_char_tokenizer(tokenizer):
    text = "x<answer>4</answer><confidence>1</confidence>y"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)  # one character per token
    pad = tokenizer.pad_token_id
    row_ids = torch.tensor([ids + [pad, pad]])
    mask = torch.tensor([[1] * len(ids) + [0, 0]])
    blocks = token_block_ids(row_ids, mask, tokenizer, TAGS)[0]
    n0 = len("x<answer>4</answer>")  # 19 characters, tokens 0..18 in block 0
    n1 = len("<confidence>1</confidence>")  # 26, tokens 19..44 in block 1
    assert blocks[:n0].tolist() == [0] * n0
    assert blocks[n0:n0 + n1].tolist() == [1] * n1
    assert blocks[n0 + n1:].tolist() == [-1, -1, -1]  # "y" after the last closing tag, then padding


def test_straddling_token_belongs_to_the_earlier_block():
    # tokens: "<answer>", "4", "</answer>\n<conf", "idence>", "1", "</confidence>"
    pieces = ["<answer>", "4", "</answer>\n<conf", "idence>", "1", "</confidence>", "<|eos|>"]
    ids = torch.tensor([[0, 1, 2, 3, 4, 5, 6]])
    blocks = token_block_ids(ids, torch.ones(1, 7), PieceTokenizer(pieces), TAGS)[0]
    # token 2 starts at "</answer>" (inside block 0) though it ends in block 1; the EOS text after
    # "</confidence>" is outside
    assert blocks.tolist() == [0, 0, 0, 1, 1, 1, -1]


def test_padding_is_never_read_and_a_masked_middle_token_is_skipped():
    pieces = ["<answer>", "4", "</answer>", "<confidence>", "1", "</confidence>", "</answer>"]
    # the masked token 6 would close block 0 early if it were read
    ids = torch.tensor([[0, 6, 1, 2, 3, 4, 5]])
    mask = torch.tensor([[1, 0, 1, 1, 1, 1, 1]])
    blocks = token_block_ids(ids, mask, PieceTokenizer(pieces), TAGS)[0]
    assert blocks.tolist() == [0, -1, 0, 0, 1, 1, 1]


def test_empty_completion_has_no_block(tokenizer):
    pad = tokenizer.pad_token_id
    blocks = token_block_ids(torch.tensor([[pad, pad]]), torch.zeros(1, 2), tokenizer, TAGS)
    assert blocks.tolist() == [[-1, -1]]


def test_spread_reads_the_block_advantage_and_zeroes_outside_and_padding():
    block_adv = torch.tensor([[0.5, 0.2], [-0.5, -0.2]])
    blocks = torch.tensor([[0, 1, -1], [1, 0, 1]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # row 1's last token is padding, though its block id says 1
    out = spread_block_advantages(block_adv, blocks, mask)
    torch.testing.assert_close(out, torch.tensor([[0.5, 0.2, 0.0], [-0.2, -0.5, 0.0]]))


@pytest.mark.parametrize(
    ("tags", "match"),
    [
        ("answer", "non-empty list"),
        ([], "non-empty list"),
        (["<answer>", "confidence"], "not a tag name"),
        (["answer", "my tag"], "not a tag name"),
        (["answer", "answer"], "repeats a tag"),
    ],
)
def test_bad_tags_name_the_flag(tags, match):
    with pytest.raises(ValueError, match=f"blockwise_adv_block_tags.*{match}|{match}"):
        check_block_tags("blockwise_adv_block_tags", tags)


def test_block_tags_field_is_the_one_param_ending_in_block_tags():
    assert block_tags_field(("x_scale", "x_block_tags")) == "x_block_tags"
    with pytest.raises(ValueError, match="exactly one"):
        block_tags_field(("x_scale",))
