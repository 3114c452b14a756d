"""mmspec: speculative, Jacobi and parallel decoding for AR generators."""
