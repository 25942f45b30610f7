package rpccode

import "testing"

// Keep and Retried never agree: a code a client retries is one that may
// change, and recording it would give every retry the same refusal.
func TestKeepAndRetried(t *testing.T) {
	kept := map[uint32]bool{0: true, 3: true}
	retried := map[uint32]bool{8: true, 10: true, 14: true}
	for c := range uint32(40) {
		if Keep(c) != kept[c] {
			t.Errorf("Keep(%d) = %v; want %v", c, Keep(c), kept[c])
		}
		if Retried(c) != retried[c] {
			t.Errorf("Retried(%d) = %v; want %v", c, Retried(c), retried[c])
		}
		if Keep(c) && Retried(c) {
			t.Errorf("code %d is both kept and retried", c)
		}
	}
}
