package client_test

import (
	"log"
	"net/http"
	"strings"

	"github.com/idemgo/idem/client"
)

// The README's block, compiled (it posts to url); ExampleNew runs the same.
var _ = readmeClient

func readmeClient(url string) error {
	// README: client
	tr, err := client.New(client.Options{}) // Base: http.DefaultTransport
	if err != nil {
		log.Fatal(err) // e.g. client: MaxWait: -1s is negative; ...
	}
	hc := &http.Client{Transport: tr}
	resp, err := hc.Post(url, "application/json", strings.NewReader(`{"amount":1000}`))
	// resp.Request.Header.Get("Idempotency-Key") is the key that was sent
	// README end
	if err == nil {
		resp.Body.Close()
	}
	return err
}
