module github.com/tenure-io/tenure/fenceproof

go 1.26.8
