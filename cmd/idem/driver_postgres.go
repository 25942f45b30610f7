//go:build !idem_nopostgres

package main

import _ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

func init() { postgresDriver = "pgx" }
