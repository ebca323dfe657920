package main

import (
	"bytes"
	"strings"
	"testing"
)

const echoStream = `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestOK"}
{"Action":"output","Package":"p","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"output","Package":"p","Test":"TestOK","Output":"--- PASS: TestOK (0.00s)\n"}
{"Action":"pass","Package":"p","Test":"TestOK","Elapsed":0}
{"Action":"run","Package":"p","Test":"TestBad"}
{"Action":"output","Package":"p","Test":"TestBad","Output":"=== RUN   TestBad\n"}
{"Action":"output","Package":"p","Test":"TestBad","Output":"    x_test.go:3: boom\n"}
{"Action":"output","Package":"p","Test":"TestBad","Output":"--- FAIL: TestBad (0.00s)\n"}
{"Action":"fail","Package":"p","Test":"TestBad","Elapsed":0}
{"Action":"output","Package":"p","Output":"FAIL\n"}
{"Action":"output","Package":"r","Output":"PASS\n"}
{"Action":"output","Package":"r","Output":"ok  \tr\t0.1s\n"}
{"ImportPath":"q","Action":"build-output","Output":"q/x.go:1: syntax error\n"}
not json
{"Action":"fail","Package":"p","Elapsed":0.1}
`

func TestEchoPlainShowsOnlyFailures(t *testing.T) {
	var out bytes.Buffer
	if err := Echo(&out, strings.NewReader(echoStream), false); err != nil {
		t.Fatal(err)
	}
	want := "=== RUN   TestBad\n    x_test.go:3: boom\n--- FAIL: TestBad (0.00s)\nFAIL\nok  \tr\t0.1s\nq/x.go:1: syntax error\nnot json\n"
	if out.String() != want {
		t.Errorf("got:\n%q\nwant:\n%q", out.String(), want)
	}
}

func TestEchoVerboseShowsEverything(t *testing.T) {
	var out bytes.Buffer
	if err := Echo(&out, strings.NewReader(echoStream), true); err != nil {
		t.Fatal(err)
	}
	want := "=== RUN   TestOK\n--- PASS: TestOK (0.00s)\n=== RUN   TestBad\n    x_test.go:3: boom\n--- FAIL: TestBad (0.00s)\nFAIL\nPASS\nok  \tr\t0.1s\nq/x.go:1: syntax error\nnot json\n"
	if out.String() != want {
		t.Errorf("got:\n%q\nwant:\n%q", out.String(), want)
	}
}
