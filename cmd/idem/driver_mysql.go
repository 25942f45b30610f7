//go:build !idem_nomysql

package main

import _ "github.com/go-sql-driver/mysql" // database/sql driver "mysql"

func init() { mysqlDriver = "mysql" }
