module kvtier

go 1.19
