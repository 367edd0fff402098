module github.com/tenure-io/tenure/e2e/zkcompat

go 1.26.0
