package rounds

import (
	"slices"
	"testing"
)

func TestSplit(t *testing.T) {
	for _, tc := range []struct {
		keys []string
		want [][]int
	}{
		{nil, nil},
		{[]string{"a", "b", "c"}, [][]int{{0, 1, 2}}},
		{[]string{"a", "a", "b", "a", "b"}, [][]int{{0, 2}, {1, 4}, {3}}},
		{[]string{"x", "x", "x"}, [][]int{{0}, {1}, {2}}},
	} {
		got := Split(len(tc.keys), func(i int) string { return tc.keys[i] })
		if !slices.EqualFunc(got, tc.want, slices.Equal[[]int]) {
			t.Errorf("Split(%q) = %v; want %v", tc.keys, got, tc.want)
		}
	}
}
