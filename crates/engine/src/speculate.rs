//! Speculative decoding with prompt lookup (the dual-stream design's speculative branches): drafts are
//! continuations of earlier occurrences of the context's last n-gram — no second model —
//! merged into a tree, verified by the target model in one step, and walked as the sampler
//! decides.
//!
//! ```text
//!  context … a b c [x y z] … a b c       next token: d
//!  lookup "b c d" → "e f g", then "c d" → "x y"             (longest n-gram first)
//!  tree (one step, one row each):  d ─ e ─ f ─ g
//!                                   └─ x ─ y
//!  rows see the cache and their own ancestors only ([`DraftTree::key_mask`]); positions by depth
//! ```
//! Verification samples row `d` with the request's own sampler; while the token equals a
//! child's, that child's row is sampled next. The first token no child has ends the walk and is
//! the next token to feed; the accepted path's KV is kept (`SeqKv::keep_slots`), every other
//! branch is dropped whole.
//!
//! Invariant: the tokens produced equal decoding without speculation — for greedy and for
//! seeded sampling alike — because every emitted token is drawn by the same sampler from logits
//! of exactly the tokens before it, one draw per token. A drafter that proposes one token per
//! position (a point mass) makes this sample-and-compare walk the standard speculative-sampling
//! acceptance rule: a draft `d` is accepted with probability `p(d)`, and on rejection the token
//! is drawn from `p` without `d`, renormalized — together, exactly `p`.

use engram_model::KeyMask;

/// Prompt lookup's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptLookup {
    /// Longest n-gram matched (tried first).
    pub max_ngram: usize,
    /// Shortest n-gram matched.
    pub min_ngram: usize,
    /// Most draft tokens after the next token along one branch.
    pub max_depth: usize,
    /// Most branches (distinct continuations) per step.
    pub max_branches: usize,
    /// Most draft tokens in one step's tree (the root not counted).
    pub max_drafts: usize,
}

impl Default for PromptLookup {
    /// 3- down to 2-grams (a 1-gram match proposes too often to pay), 8 deep, 4 branches,
    /// 8 drafts a step: past a few rows a step costs more per row (the matmuls leave the
    /// memory bound), and 8 beat 16 on the real SmolLM2-135M and on pycode-long
    /// (docs/speculative-decoding.md).
    fn default() -> Self {
        PromptLookup { max_ngram: 3, min_ngram: 2, max_depth: 8, max_branches: 4, max_drafts: 8 }
    }
}

impl PromptLookup {
    /// The tree of drafts after `next`, the token about to be fed, looked up in `context`
    /// (the tokens before it), with at most `budget` draft tokens. Branches come from the most
    /// recent occurrences of the longest n-gram ending at `next`, then of shorter ones, until
    /// `max_branches` distinct branches or the budget.
    pub fn draft(&self, context: &[u32], next: u32, budget: usize) -> DraftTree {
        let mut tree = DraftTree::root(next);
        let budget = budget.min(self.max_drafts);
        if budget == 0 || self.max_depth == 0 {
            return tree;
        }
        // The search runs over `context + [next]`, without copying the context.
        let len = context.len() + 1;
        let at = |i: usize| if i < context.len() { context[i] } else { next };
        let mut branches = 0;
        for n in (self.min_ngram.max(1)..=self.max_ngram).rev() {
            if n >= len {
                continue;
            }
            let pattern = len - n;
            // Occurrences ending before the last token, most recent first.
            for start in (0..pattern).rev() {
                if branches == self.max_branches || tree.len() > budget {
                    return tree;
                }
                if (0..n).any(|j| at(start + j) != at(pattern + j)) {
                    continue;
                }
                let from = start + n;
                let branch: Vec<u32> = (from..(from + self.max_depth).min(len)).map(at).collect();
                if tree.insert(&branch, budget) {
                    branches += 1;
                }
            }
        }
        tree
    }
}

/// A tree of tokens to verify in one step: node 0 is the root (the sampled token about to be
/// fed), every other node a draft whose parent comes before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DraftTree {
    tokens: Vec<u32>,
    parent: Vec<usize>,
    depth: Vec<u32>,
}

impl DraftTree {
    /// The tree of `next` alone (no drafts).
    pub fn root(next: u32) -> DraftTree {
        DraftTree { tokens: vec![next], parent: vec![0], depth: vec![0] }
    }

    /// Adds `branch` under the root, sharing the prefix it has in common with the tree, as far
    /// as `budget` draft tokens allow. True if it added a node.
    pub fn insert(&mut self, branch: &[u32], budget: usize) -> bool {
        let (mut node, mut added) = (0, false);
        for &t in branch {
            node = match self.child(node, t) {
                Some(c) => c,
                None if self.tokens.len() - 1 < budget => {
                    self.tokens.push(t);
                    self.parent.push(node);
                    self.depth.push(self.depth[node] + 1);
                    added = true;
                    self.tokens.len() - 1
                }
                None => break,
            };
        }
        added
    }

    /// Nodes, the root included.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the tree is the root alone.
    pub fn is_empty(&self) -> bool {
        self.tokens.len() == 1
    }

    /// Each node's token, in node order (the step's input).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Each node's depth (the root's is 0): its position is the root's plus its depth.
    pub fn depths(&self) -> &[u32] {
        &self.depth
    }

    /// Whether `node` has no children (a walk that reaches it has used the whole branch).
    pub fn is_leaf(&self, node: usize) -> bool {
        !self.parent[node + 1..].contains(&node)
    }

    /// The child of `node` holding `token`.
    pub fn child(&self, node: usize, token: u32) -> Option<usize> {
        (node + 1..self.tokens.len()).find(|&c| self.parent[c] == node && self.tokens[c] == token)
    }

    /// What each node's row may see in a view of `keys_before` keys followed by the tree's
    /// own: every key before, and the node's ancestors and itself among the tree's.
    pub fn key_mask(&self, keys_before: usize) -> KeyMask {
        let n = self.tokens.len();
        let mut mask = KeyMask::all(n, keys_before + n);
        for row in 0..n {
            mask.set_range(row, keys_before..keys_before + n, false);
            let mut node = row;
            loop {
                mask.set(row, keys_before + node, true);
                if node == 0 {
                    break;
                }
                node = self.parent[node];
            }
        }
        mask
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_matching_ngram_proposes_what_followed_it() {
        let lookup = PromptLookup { max_branches: 1, ..Default::default() };
        // "1 2 3 4 5 6 … 1 2" + next 3: the 3-gram "1 2 3" occurred before, followed by 4 5 6.
        let context = [1, 2, 3, 4, 5, 6, 9, 9, 1, 2];
        let tree = lookup.draft(&context, 3, 16);
        assert_eq!(tree.tokens(), [3, 4, 5, 6, 9, 9, 1, 2, 3]);
        assert_eq!(tree.depths(), [0, 1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn branches_share_their_common_prefix_and_respect_the_budget() {
        let lookup = PromptLookup { max_depth: 3, ..Default::default() };
        // "7 8" followed by "1 2 3" and, more recently, by "1 5 6".
        let context = [7, 8, 1, 2, 3, 0, 7, 8, 1, 5, 6, 0, 7];
        let tree = lookup.draft(&context, 8, 16);
        assert_eq!(tree.tokens(), [8, 1, 5, 6, 2, 3]);
        assert_eq!(tree.child(1, 2), Some(4), "the older branch shares the node of its first token");
        // Nodes 3 (6) and 5 (3) end their branches; the root and the shared node 1 do not.
        assert_eq!((0..6).filter(|&n| tree.is_leaf(n)).collect::<Vec<_>>(), [3, 5]);
        assert_eq!(lookup.draft(&context, 8, 2).tokens(), [8, 1, 5]);
        assert!(lookup.draft(&context, 8, 0).is_empty());
    }

    #[test]
    fn without_a_match_there_is_nothing_to_draft() {
        assert!(PromptLookup::default().draft(&[1, 2, 3, 4], 5, 16).is_empty());
        assert!(PromptLookup::default().draft(&[], 5, 16).is_empty());
    }

    #[test]
    fn rows_see_everything_before_and_their_own_ancestors() {
        let mut tree = DraftTree::root(10);
        tree.insert(&[11, 12], 8);
        tree.insert(&[13], 8);
        let mask = tree.key_mask(5);
        let visible = |row: usize| (0..9).filter(|&k| mask.sees(row, k)).collect::<Vec<_>>();
        assert_eq!(visible(0), [0, 1, 2, 3, 4, 5]);
        assert_eq!(visible(2), [0, 1, 2, 3, 4, 5, 6, 7], "node 2 (12) under node 1 (11)");
        assert_eq!(visible(3), [0, 1, 2, 3, 4, 5, 8], "node 3 (13) is a sibling of node 1");
    }
}
