// Package batch holds what the batch calls of every store in this module
// (package idem's and sqlstore's) share about their items.
package batch

// Item returns a batch call's i-th fingerprint or result: s[i], or nil
// when s is nil (the batch calls take a nil slice for "none").
func Item(s [][]byte, i int) []byte {
	if s == nil {
		return nil
	}
	return s[i]
}

// Collect records item i's error in errs, making errs (n long) on the
// first error, so that a batch without failures allocates nothing for
// them. A nil err changes nothing.
func Collect(errs []error, n, i int, err error) []error {
	if err == nil {
		return errs
	}
	if errs == nil {
		errs = make([]error, n)
	}
	errs[i] = err
	return errs
}
