// Package regrant lets this module's tests hand a store one of its own
// leases with another key, token or owner, past the check that refuses a
// lease changed after its grant (idem.Core). A store's own answer to such a
// lease (no live claim of that token and owner: ErrLeaseLost, nothing
// touched) can otherwise not be reached, yet it is what stands between a
// stale worker and its successor when tokens repeat: a server clock stepped
// back, a record written by hand. storetest's and lincheck's forged leases
// come from here; nothing outside this module can import it.
package regrant

// Lease is set by package idem when it is initialised (importing idem is
// enough). It returns a copy of l, which must be an *idem.Lease, with
// Key, Token and Owner replaced: the store that granted l accepts the copy
// as granted so. A Forget of either marks both forgotten, as for a plain
// copy. A lease that no store granted stays one.
var Lease func(l any, key string, token int64, owner string) any
