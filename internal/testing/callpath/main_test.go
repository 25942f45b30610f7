package main

import (
	"strings"
	"testing"
)

// The fixture's three files and their calls are known: the walk must print
// exactly this tree and these figures (count, in c.go, calls back up into
// a.go once). ignored.go, excluded by its build
// constraint, would declare check twice.
func TestRun(t *testing.T) {
	for _, tc := range []struct{ key, want string }{
		{"", `(*T).Start  a.go:11
  (*T).done  a.go:21
  prefix  b.go:3
    check  c.go:3
  (*T).store  b.go:5
    (*T).count  c.go:6
      (*T).done (seen) ^  a.go:21
    f (func value)  b.go:8
    (*T).count (seen)  c.go:6
  d.Do (interface)  a.go:15
  (*T).done (seen)  a.go:21
  (*T).count (seen)  c.go:6
  skip  c.go:9

path: a.go > b.go > c.go > b.go > a.go > b.go > c.go > b.go > a.go > c.go > a.go
files: 3
climbs back: 8
calls back up: 1
`},
		// Start's own done is called on a receiver that does not carry
		// the key yet; count's is, once store gave t the key, and climbs
		// back up into a.go. skip gets the key but does not use it.
		{"key", `(*T).Start  a.go:11
  prefix  b.go:3
    check  c.go:3
  (*T).store  b.go:5
    (*T).count  c.go:6
      (*T).done ^  a.go:21
    f (func value)  b.go:8
    (*T).count (seen)  c.go:6
  d.Do (interface)  a.go:15
  (*T).count (seen)  c.go:6

path: a.go > b.go > c.go > b.go > a.go > b.go > c.go > a.go > c.go > b.go > a.go
files: 3
climbs back: 8
calls back up: 1
`},
	} {
		var out strings.Builder
		if err := run(&out, "testdata/fixture", "(*T).Start", tc.key); err != nil {
			t.Fatalf("run(-key %q) = %v", tc.key, err)
		}
		if got := out.String(); got != tc.want {
			t.Errorf("run(-key %q) printed\n%s\nwant\n%s", tc.key, got, tc.want)
		}
	}
}

func TestRunUnknown(t *testing.T) {
	var out strings.Builder
	if err := run(&out, "testdata/fixture", "(*T).Stop", ""); err == nil {
		t.Errorf("run((*T).Stop) = nil; want an error: the fixture declares no Stop")
	}
	if err := run(&out, "testdata/fixture", "(*T).Start", "id"); err == nil {
		t.Errorf("run((*T).Start, -key id) = nil; want an error: Start has no parameter id")
	}
}
