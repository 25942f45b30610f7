package batch

import (
	"errors"
	"testing"
)

func TestItem(t *testing.T) {
	if got := Item(nil, 3); got != nil {
		t.Errorf("Item(nil, 3) = %q; want nil", got)
	}
	s := [][]byte{[]byte("a"), nil, []byte("c")}
	if got := Item(s, 2); string(got) != "c" {
		t.Errorf("Item(s, 2) = %q; want %q", got, "c")
	}
}

func TestCollect(t *testing.T) {
	var errs []error
	errs = Collect(errs, 3, 0, nil)
	if errs != nil {
		t.Fatalf("Collect of a nil error made %v; want nil (nothing to report)", errs)
	}
	boom := errors.New("boom")
	errs = Collect(errs, 3, 1, boom)
	errs = Collect(errs, 3, 2, nil)
	if len(errs) != 3 || errs[0] != nil || errs[1] != boom || errs[2] != nil {
		t.Errorf("Collect = %v; want [nil boom nil]", errs)
	}
}
