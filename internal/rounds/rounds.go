// Package rounds splits a batch so that no key appears twice in one part.
// consumer.Batch finds a key's second item in a batch still in progress
// (the first holds the key), which would hold that item back for a retry;
// handled a round later, it finds the key done, or the first failed, at
// once. The adapters that hand consumer.Batch a broker's batch (Kafka,
// Redis Streams, JetStream) split it so.
package rounds

// Split returns the indexes 0..n-1 in rounds, in order: round r holds each
// key's (r+1)-th item, and no key twice. key(i) is item i's key. One round
// holding every index is the common case, a batch without repeated keys.
func Split(n int, key func(i int) string) [][]int {
	if n == 0 {
		return nil
	}
	seen := make(map[string]int, n) // key → items of it so far
	var out [][]int
	for i := range n {
		k := key(i)
		r := seen[k]
		seen[k] = r + 1
		if r == len(out) {
			out = append(out, nil)
			if r == 0 {
				out[0] = make([]int, 0, n)
			}
		}
		out[r] = append(out[r], i)
	}
	return out
}
