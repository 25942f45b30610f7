//go:build !idem_nosqlite

package main

import _ "modernc.org/sqlite" // database/sql driver "sqlite"

func init() { sqliteDriver = "sqlite" }
