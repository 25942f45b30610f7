package middleware

import (
	"strconv"
	"strings"
	"testing"
)

// splitStoreKey reverses storeKey: "h2", then two length-prefixed parts.
// ok is false for anything storeKey cannot have produced.
func splitStoreKey(k string) (parts [2]string, ok bool) {
	rest, found := strings.CutPrefix(k, "h2")
	if !found {
		return parts, false
	}
	for i := range parts {
		n, tail, found := strings.Cut(rest, ":")
		if !found {
			return parts, false
		}
		size, err := strconv.Atoi(n)
		if err != nil || size < 0 || size > len(tail) || strconv.Itoa(size) != n {
			return parts, false
		}
		parts[i], rest = tail[:size], tail[size:]
	}
	return parts, rest == ""
}

// FuzzStoreKey: the store key of (scope, key) decodes back to exactly
// those two parts, so two different pairs never share a record, whatever
// bytes (':' and digits included) each part holds.
func FuzzStoreKey(f *testing.F) {
	f.Add("a:b", "c", "a", "b:c")
	f.Add("", "a:bc", "a", "bc")
	f.Add("1:a", "c", "", "1:a1:c")
	f.Add("h2", "k", "", "h2k")
	f.Add("acme", "k", "acme1:k", "")
	f.Add("10:", "k", "1", "0:k")
	f.Fuzz(func(t *testing.T, s1, k1, s2, k2 string) {
		a, b := [2]string{s1, k1}, [2]string{s2, k2}
		ka, kb := storeKey(s1, k1), storeKey(s2, k2)
		if got, ok := splitStoreKey(ka); !ok || got != a {
			t.Fatalf("storeKey(%q) = %q, which decodes to %q, %v; want the parts back", a, ka, got, ok)
		}
		if (a == b) != (ka == kb) {
			t.Fatalf("storeKey(%q) = %q and storeKey(%q) = %q; want equal keys exactly for equal pairs", a, ka, b, kb)
		}
	})
}
