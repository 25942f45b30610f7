package middleware

import (
	"strconv"
	"strings"
	"testing"
)

// splitStoreKey reverses storeKey: "h1", then four length-prefixed parts.
// ok is false for anything storeKey cannot have produced.
func splitStoreKey(k string) (parts [4]string, ok bool) {
	rest, found := strings.CutPrefix(k, "h1")
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

// FuzzStoreKey: the store key of (scope, method, route, key) decodes back
// to exactly those four parts, so two different tuples never share a
// record, whatever bytes (':' and digits included) each part holds.
func FuzzStoreKey(f *testing.F) {
	f.Add("a:b", "POST", "/x", "c", "a", "POST", "/x", "b:c")
	f.Add("", "POST", "/x", "a:bc", "a", "POST", "/x:", "bc")
	f.Add("1:a", "POST", "/x", "c", "", "POST1:", "/x", "c")
	f.Add("h1", "", "", "k", "", "", "", "h1k")
	f.Add("t", "POST", "/orders", "k", "t", "PATCH", "/orders", "k")
	f.Add("acme", "POST", "POST /orders/{id}", "k", "acme4:POST", "", "/orders/{id}", "k")
	f.Add("10:", "P", "/", "k", "1", "0:P", "/", "k")
	f.Fuzz(func(t *testing.T, s1, m1, r1, k1, s2, m2, r2, k2 string) {
		a, b := [4]string{s1, m1, r1, k1}, [4]string{s2, m2, r2, k2}
		ka, kb := storeKey(s1, m1, r1, k1), storeKey(s2, m2, r2, k2)
		if got, ok := splitStoreKey(ka); !ok || got != a {
			t.Fatalf("storeKey(%q) = %q, which decodes to %q, %v; want the parts back", a, ka, got, ok)
		}
		if (a == b) != (ka == kb) {
			t.Fatalf("storeKey(%q) = %q and storeKey(%q) = %q; want equal keys exactly for equal tuples", a, ka, b, kb)
		}
	})
}
