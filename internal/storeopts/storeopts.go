// Package storeopts turns the options every store shares (idem.Options)
// into a store's own flat literal, for code that holds the shared ones: a
// storetest Backend's Open, the command's flags.
package storeopts

import (
	"github.com/idemgo/idem"
	"github.com/idemgo/idem/sqlstore"
)

// Redis returns RedisOptions with o's shared fields; the Redis-only fields
// are left zero for the caller to set.
func Redis(o idem.Options) idem.RedisOptions {
	return idem.RedisOptions{Retention: o.Retention, LeaseTTL: o.LeaseTTL, Worker: o.Worker,
		MaxKeyBytes: o.MaxKeyBytes, MaxResultBytes: o.MaxResultBytes, Logger: o.Logger,
		Observer: o.Observer, KeyHasher: o.KeyHasher, RevealKeys: o.RevealKeys}
}

// SQL returns sqlstore.Options with o's shared fields and dialect d; Table
// and LockTimeout are left zero for the caller to set.
func SQL(o idem.Options, d sqlstore.Dialect) sqlstore.Options {
	return sqlstore.Options{Retention: o.Retention, LeaseTTL: o.LeaseTTL, Worker: o.Worker,
		MaxKeyBytes: o.MaxKeyBytes, MaxResultBytes: o.MaxResultBytes, Logger: o.Logger,
		Observer: o.Observer, KeyHasher: o.KeyHasher, RevealKeys: o.RevealKeys, Dialect: d}
}
