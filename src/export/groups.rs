//! Whole groups for GRPO-style trainers (`export rl --group-size N`).
//!
//! Samples arrive in output order, where a group's samples are contiguous
//! (calls are partitioned and sorted by group). A [`GroupBuffer`] holds the
//! current group's samples, at most N of them, and releases the group when
//! the group key changes: whole when it reached N samples (the first N in
//! output order; later ones are dropped), not at all when it has fewer.

/// Buffers one group at a time, releasing only groups of exactly `size`.
#[derive(Debug)]
pub struct GroupBuffer<T> {
    size: usize,
    key: Option<String>,
    items: Vec<T>,
    /// Groups released (exactly `size` samples).
    pub complete_groups: usize,
    /// Groups dropped for having fewer than `size` samples.
    pub incomplete_groups: usize,
    /// Samples dropped: those of incomplete groups, and those past the
    /// first `size` of a group.
    pub dropped: usize,
}

impl<T> GroupBuffer<T> {
    /// A buffer for groups of `size` samples (a `size` of 0 keeps nothing).
    pub fn new(size: usize) -> GroupBuffer<T> {
        GroupBuffer {
            size,
            key: None,
            items: Vec::new(),
            complete_groups: 0,
            incomplete_groups: 0,
            dropped: 0,
        }
    }

    /// Take the next sample, of group `key`. When `key` starts a new group,
    /// the previous group is closed: returned when it is complete.
    pub fn push(&mut self, key: &str, item: T) -> Option<Vec<T>> {
        let released = if self.key.as_deref() == Some(key) {
            None
        } else {
            let r = self.close();
            self.key = Some(key.to_owned());
            r
        };
        if self.items.len() < self.size {
            self.items.push(item);
        } else {
            self.dropped += 1;
        }
        released
    }

    /// Close the last group: returned when it is complete.
    pub fn finish(&mut self) -> Option<Vec<T>> {
        self.close()
    }

    fn close(&mut self) -> Option<Vec<T>> {
        self.key.take()?;
        if self.size > 0 && self.items.len() == self.size {
            self.complete_groups += 1;
            return Some(std::mem::take(&mut self.items));
        }
        self.incomplete_groups += 1;
        self.dropped += self.items.len();
        self.items.clear();
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(size: usize, input: &[(&str, u32)]) -> (Vec<Vec<u32>>, GroupBuffer<u32>) {
        let mut b = GroupBuffer::new(size);
        let mut out = vec![];
        for &(k, x) in input {
            out.extend(b.push(k, x));
        }
        out.extend(b.finish());
        (out, b)
    }

    #[test]
    fn whole_groups_of_exactly_n_in_arrival_order() {
        let input = [
            ("a", 1),
            ("a", 2),
            ("a", 3),
            ("b", 4),
            ("c", 5),
            ("c", 6),
            ("d", 7),
            ("d", 8),
        ];
        let (out, b) = run(2, &input);
        assert_eq!(out, vec![vec![1, 2], vec![5, 6], vec![7, 8]]);
        assert_eq!((b.complete_groups, b.incomplete_groups), (3, 1));
        // 3 (past the first two of a) and 4 (b has one sample).
        assert_eq!(b.dropped, 2);
    }

    #[test]
    fn a_last_short_group_and_an_empty_input_release_nothing() {
        let (out, b) = run(3, &[("a", 1), ("a", 2), ("a", 3), ("b", 4), ("b", 5)]);
        assert_eq!(out, vec![vec![1, 2, 3]]);
        assert_eq!((b.incomplete_groups, b.dropped), (1, 2));
        let (out, b) = run(3, &[]);
        assert!(out.is_empty());
        assert_eq!(
            (b.complete_groups, b.incomplete_groups, b.dropped),
            (0, 0, 0)
        );
        let (out, b) = run(0, &[("a", 1)]);
        assert!(out.is_empty());
        assert_eq!((b.incomplete_groups, b.dropped), (1, 1));
    }

    #[test]
    fn a_key_seen_again_later_is_a_new_group() {
        let (out, b) = run(1, &[("a", 1), ("b", 2), ("a", 3)]);
        assert_eq!(out, vec![vec![1], vec![2], vec![3]]);
        assert_eq!(b.complete_groups, 3);
    }
}
